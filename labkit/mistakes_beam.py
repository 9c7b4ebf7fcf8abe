"""Catalogue entries for the beam-search step check (:mod:`.beam`), merged into ``MISTAKES``.

Each hint names the idea to revisit, never the line that fixes it.
"""
from __future__ import annotations

BEAM: dict[str, tuple[str, str]] = {
    "beam_finished_expanded": (
        "a hypothesis that ended in <eos> is still in the beam, so the next step extends it "
        "past its end", "an <eos> candidate ranked in the top K is finished: it goes to the "
        "finished hypotheses, and the K live prefixes are the best candidates that did not "
        "end in <eos>"),
    "beam_pad_bos_not_excluded": (
        "a live prefix was extended by <pad> or <bos>", "neither is ever a training label: "
        "like greedy decoding, a step must never choose them"),
    "beam_logp_not_summed": (
        "a candidate's score is the new token's log-probability alone, not the prefix's score "
        "plus it", "a hypothesis is scored by the log-probability of the whole sequence: the "
        "log of a product of conditional probabilities"),
    "beam_no_log_softmax": (
        "the scores add raw logits, not log-probabilities", "logits are unnormalised: only "
        "after normalising over the vocabulary do they become log-probabilities that add up "
        "along a sequence"),
    "beam_renormalised": (
        "the log-probabilities were renormalised after removing <pad> and <bos>; tx (and this "
        "exercise) scores with the model's own softmax over the whole vocabulary",
        "normalise first, over every token, then rule out the two forbidden ones"),
    "beam_live_not_sorted": (
        "the right K live prefixes, but not best first", "the driver reads the best live "
        "score from row 0 to decide when to stop"),
    "beam_wrong_selection": (
        "the live prefixes are scored right but the wrong ones are kept", "the K survivors "
        "are the best of all K x V extensions together, across beams, not the best of each "
        "beam"),
    "beam_top_k_only": (
        "only the top K candidates were ranked, so each <eos> among them left one live prefix "
        "fewer than K", "a finished hypothesis leaves the beam, yet K prefixes must stay "
        "alive: rank enough candidates that K of them can still be live"),
    "beam_per_beam_top_k": (
        "each beam kept only its own top K candidates before the ranking across beams, so a "
        "beam that deserves more survivors loses some (here the first step, where one beam is "
        "real and an <eos> is among its top K)", "the survivors can all come from one beam: "
        "how many candidates must each beam offer so that K of them can be live?"),
    "beam_finished_wrong_set": (
        "the finished hypotheses are not the <eos> candidates ranked in the top K",
        "rank all candidates together; an <eos> candidate that K others beat is dropped"),
    "beam_finished_from_top_2k": (
        "every <eos> candidate of the top 2K is finished, also those ranked below the top K",
        "an <eos> candidate counts as finished only where it would have survived: K others "
        "that beat it leave it out, as they would a live prefix"),
    "beam_no_length_penalty": (
        "a finished hypothesis is scored by its summed log-probability alone, with no length "
        "penalty, so short outputs win", "finished hypotheses of different lengths are compared "
        "only after the GNMT length penalty of section 4 has divided their sums"),
    "beam_penalty_length_off": (
        "the length penalty is computed for the wrong length", "length counts the generated "
        "tokens, <eos> included, <bos> not"),
    "beam_cache_unused": (
        "the step did not feed the newest tokens through the cache (its length did not grow "
        "by one)", "a cached step decodes only the last column of alive and passes the "
        "cache along (section 3)"),
    "beam_cache_not_reordered": (
        "the cache was not reordered: row i of the self-attention cache still holds the old "
        "beam i's history, not that of live prefix i's parent", "after pruning, each survivor "
        "must take its parent's keys and values (the KVCache method for this is in section 4)"),
    "beam_cache_wrong_index": (
        "the cache was reordered with the wrong index", "the index to keep is, for each "
        "survivor, the beam row it descends from (its parent), in the survivors' order"),
}
