"""`make models`: train the shipped models from their recipes and rewrite their checksums.

    python tools/make_models.py            # every model in tx_helpers.pretrained.RECIPES
    python tools/make_models.py dates      # one of them
"""
import sys

from tx_helpers.pretrained import build

if __name__ == "__main__":
    build(sys.argv[1:] or None)
