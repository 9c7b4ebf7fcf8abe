"""Course builders: exercise copies, teacher keys, the handout, the nbgrader export and grading.

Each module is a command line: ``python -m labkit.course.exercises`` (``make exercises``),
``.keys`` (``make keys``), ``.handout`` (``make handout``), ``.nbgrader_export``
(``make nbgrader``) and ``.grade`` (``make grade``).
"""
