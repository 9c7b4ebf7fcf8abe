"""Catalogue entries for the label-smoothing, greedy-decoding and tied-embedding checks.

Kept apart from :mod:`.mistakes` (which merges them into ``MISTAKES``) so each file stays short.
"""
from __future__ import annotations

_LS_TARGET = ("q = (1 - eps) * one_hot(target, V) + eps / V: every class, the true one and the "
              "pad column included, gets eps / V, so the true class gets 1 - eps + eps / V "
              "(nn.CrossEntropyLoss(label_smoothing=eps) does the same)")

LOSS_AND_DECODING: dict[str, tuple[str, str]] = {
    # label smoothing
    "ls_spread_over_v_minus_1": ("eps is spread over the V - 1 wrong classes only; this "
                                 "exercise (like PyTorch) spreads it over all V classes",
                                 "PyTorch's convention spreads eps uniformly over all V classes, "
                                 "the true class and the pad column included"),
    "ls_spread_over_v_minus_2": ("eps is spread over V - 2 classes (neither the true class nor "
                                 "the pad column, the Annotated Transformer's convention); "
                                 "this exercise (like PyTorch) spreads it over all V",
                                 "PyTorch's convention spreads eps uniformly over all V classes, "
                                 "the true class and the pad column included"),
    "ls_true_class_missing_share": ("the true class gets 1 - eps instead of 1 - eps + eps / V: "
                                    "the smoothed target does not sum to 1",
                                    "the smoothed target is a distribution: it sums to one, the "
                                    "true class included in the uniform share"),
    "ls_pad_not_ignored": ("positions whose label is the pad id count in the loss",
                           "a position whose label is the pad id is not a prediction: it is left "
                           "out of the loss"),
    "ls_mean_over_all_positions": ("pad positions are zeroed but the sum is divided by all "
                                   "positions instead of the non-pad ones, so more padding "
                                   "means a smaller loss",
                                   "the mean runs over the positions that count, the non-pad "
                                   "labels, so padding does not shrink the loss"),
    "ls_sum_not_mean": ("the loss is summed over positions instead of averaged",
                        "the loss is a mean over the non-pad positions, like PyTorch's default "
                        "reduction"),
    "ls_mean_over_classes": ("the loss is averaged over the classes as well as the positions "
                             "(a mean over the (M, V) matrix), so it is V times too small",
                             "each position's cross-entropy is a sum over the classes; only the "
                             "positions are averaged"),
    "ls_kl_divergence": ("the loss is the KL divergence KL(q || p), which is the cross-entropy "
                         "minus the entropy of q: same gradients, but its floor is 0, not H(q), "
                         "and its numbers are not comparable with nn.CrossEntropyLoss",
                         "the loss is the cross-entropy with the smoothed target, whose floor is "
                         "the target's entropy, not zero"),
    "ls_eps_ignored": ("no smoothing happens: the loss is the plain cross-entropy",
                       "smoothing mixes the one-hot target with a uniform distribution, in "
                       "proportion eps"),
    "ls_eps_hardcoded": ("eps is hard-coded (0.1) instead of taken from the eps argument",
                         "eps is an argument: take it from there everywhere"),
    "ls_log_of_softmax": ("the log-probabilities are computed as log(softmax(logits)) (or "
                          "with a clamp): for a large logit gap the softmax underflows to 0 "
                          "and log(0) = -inf",
                          "the log of a softmax that underflowed is minus infinity; look up the "
                          "numerically stable log-softmax"),
    "ls_builtin_smoothing": ("the loss hands eps to PyTorch's own label smoothing instead of "
                             "building the smoothed target, which is the exercise",
                             "build the smoothed target distribution yourself from the one-hot "
                             "label and a uniform share; the plain cross-entropy may help"),
    "ls_pad_keep_inverted": ("only the pad positions are averaged: the condition that keeps "
                             "positions is inverted, so a batch without padding gives NaN",
                             "the positions that count are those whose label is not the pad "
                             "id"),
    "ls_reduction_wrong": ("the loss is not a mean over positions: equal positions do not "
                           "give the loss of one of them",
                           "the loss is the mean of the per-position losses over the non-pad "
                           "positions"),
    "loss_divided_twice": ("the loss is divided by the number of tokens again, after a "
                           "reduction that already averages, so the loss and its gradients "
                           "shrink with the batch",
                           "one average over the target tokens is enough: the criterion "
                           "already takes it"),
    "ls_no_log_softmax": ("the loss is linear in the raw logits: the smoothed target "
                          "multiplies the logits instead of their log-softmax",
                          "the cross-entropy compares the target with log-probabilities, "
                          "which the raw logits are not"),
    "ls_sign_flipped": ("the loss has the wrong sign (the minus of the cross-entropy is "
                        "missing): it falls as the model gets worse",
                        "a cross-entropy is positive and falls as the true class gets "
                        "likelier"),
    "ls_target_wrong": ("the smoothed target distribution is not (1 - eps) one-hot + eps / V",
                        "the target mixes the one-hot label with a uniform distribution over "
                        "all V classes, in proportion eps, and sums to one"),
    "ls_not_cross_entropy": ("at one position, the loss is not a cross-entropy of the "
                             "log-softmax with any target distribution",
                             "each position's loss is minus the target-weighted sum of the "
                             "log-probabilities"),
    "step_eval_mode": ("the forward pass of the training step runs in eval mode",
                       "training runs in train mode: dropout is part of what is trained"),
    "clip_after_step": ("the gradients are clipped after optimizer.step(), so the update used "
                        "the unclipped gradients",
                        "clipping only protects the update if it happens before the update"),
    "clip_by_value": ("the gradients are clipped element by element (by value), not by their "
                      "global norm, which changes their direction",
                      "norm clipping rescales all the gradients together, keeping their "
                      "direction"),
    "grad_norm_not_global": ("the returned grad_norm is the sum of the per-tensor norms, not the "
                             "global norm of all the gradients",
                             "the global norm is the norm of all the gradients seen as one "
                             "vector"),
    "loss_detached": ("the returned loss carries no gradient (.item(), numpy or "
                      "torch.tensor(...) on a result cuts the graph)",
                      "the returned loss must stay in the autograd graph: compute it with tensor "
                      "operations and return the tensor"),
    # greedy decoding
    "decode_no_eval": ("the model decodes in train mode, so dropout is on and the tokens are "
                       "random",
                       "decoding is inference: dropout must be off while it runs, and the model's "
                       "mode given back afterwards"),
    "decode_no_early_stop": ("the loop always runs max_len steps: once every row has "
                             "produced EOS it goes on writing padding columns",
                             "the batch is done once every row has ended; later steps only "
                             "add padding"),
    "decode_argmax_wrong_dim": ("the argmax runs over the positions axis instead of the "
                                "vocabulary",
                                "the next token is the best entry of the vocabulary axis of the "
                                "last position's logits"),
    "decode_no_feedback": ("the generated token is not fed back: every step decodes the same "
                           "prefix (only BOS), or reads the first position's logits, which "
                           "see only BOS",
                           "greedy decoding is autoregressive: each step reads everything "
                           "generated so far and takes the newest position's prediction"),
    "decode_no_padding_after_eos": ("a row keeps generating after its EOS instead of being "
                                    "padded",
                                    "a row that has produced EOS is finished: every later "
                                    "position of that row is padding"),
    "decode_stops_at_first_eos": ("decoding stops as soon as one row produces EOS; the other "
                                  "rows are cut short",
                                  "the batch may stop only once every row has finished"),
    "decode_pad_bos_not_excluded": ("PAD or BOS can be predicted: they are never labels, so "
                                    "they must be excluded from the argmax",
                                    "PAD and BOS are never labels, so a step must never choose "
                                    "them"),
    "decode_max_len_off_by_one": ("the number of generated tokens is off by one: max_len "
                                  "counts generated tokens, not BOS",
                                  "max_len counts the generated tokens, BOS not included"),
    "decode_src_mask_missing": ("the decoder is called without the source padding mask, so "
                                "cross-attention reads padded memory positions",
                                "cross-attention must not read padded source positions: the "
                                "decoder needs the source padding mask too"),
    "decode_no_lookahead": ("the decoder runs on the prefix without the look-ahead mask",
                            "the decoder's self-attention still needs its look-ahead mask at "
                            "inference"),
    "decode_no_bos_column": ("the output lacks the BOS column; tx.greedy_decode returns it in "
                             "column 0",
                             "the reference returns BOS in column 0, before the generated tokens"),
    "decode_encoder_unmasked": ("the encoder runs without the source padding mask, so the "
                                "memory mixes in padded source positions",
                                "the source padding mask belongs to the encoder's "
                                "self-attention as well as to cross-attention"),
    "decode_newest_token_only": ("each step feeds the decoder only the newest token (without a "
                                 "cache), so it never sees the earlier outputs and every token "
                                 "sits at position 0",
                                 "without a cache, the decoder needs the whole prefix "
                                 "generated so far at every step"),
    "decode_prefix_wrong": ("the prefix fed to the decoder is not BOS followed by the tokens "
                            "generated so far",
                            "what the decoder reads at a step is exactly what the loop has "
                            "output up to that step"),
    "decode_not_argmax": ("the token chosen is not the argmax of the last position's logits "
                          "(sampled, or read from another position)",
                          "greedy decoding is deterministic: the most likely token at the "
                          "newest position"),
    "decode_eos_after_eos": ("finished rows are filled with EOS instead of PAD after their EOS",
                             "after its EOS a row is padding, like every padded target"),
    # tied embeddings
    "generator_no_bias": ("the generator has no bias (for example nn.Linear(..., bias=False)); "
                          "tx.Transformer's generator, which the exercise asks for, has one",
                          "the generator is a linear layer from d_model to the target "
                          "vocabulary with a bias of one score per vocabulary entry; tying "
                          "shares its weight only"),
    "embeddings_not_tied": ("with share_embeddings=True the source embedding, the target "
                            "embedding and the generator must be one Parameter",
                            "tying means one Parameter object shared by the two embeddings and "
                            "the generator, not three"),
    "embeddings_copied_not_tied": ("the embedding matrices hold equal numbers but are separate "
                                   "Parameters (copied, not shared): they drift apart in "
                                   "training and take three times the memory",
                                   "a copy is a new Parameter that drifts apart in training: "
                                   "share the object itself"),
    "generator_sized_by_source_vocab": ("the generator's output size is the source "
                                        "vocabulary's; the logits score target tokens",
                                        "the generator maps d_model to tgt_vocab_size: equal "
                                        "vocabularies hide the difference"),
    "mask_polarity_inverted": ("a mask forward builds for None is True where a position may be "
                               "attended (SDPA's convention); tx's masks are True where it is "
                               "hidden",
                               "in tx's convention a mask is True where a key is hidden: "
                               "the padding and the future (notebook 05)"),
    "tied_although_not_shared": ("the model ties its embeddings and generator although the "
                                 "config says share_embeddings=False",
                                 "tie only when the config asks for it; otherwise each module "
                                 "keeps its own matrix, as the reference model does"),
}
