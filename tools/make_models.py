"""`make models`: train the shipped models from their recipes and rewrite their checksums.

    python tools/make_models.py            # every model in tx_helpers.pretrained.RECIPES
    python tools/make_models.py g2p        # one of them (make models NAMES=g2p)

Each run saves a checkpoint to build/checkpoints/<name>.pt every 100 steps; run the same
command again after an interruption and it resumes there, to the same weights.
"""
import sys

from tx_helpers.pretrained import build

if __name__ == "__main__":
    build(sys.argv[1:] or None)
