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
                                 _LS_TARGET),
    "ls_spread_over_v_minus_2": ("eps is spread over V - 2 classes (neither the true class nor "
                                 "the pad column, the Annotated Transformer's convention); "
                                 "this exercise (like PyTorch) spreads it over all V",
                                 _LS_TARGET),
    "ls_true_class_missing_share": ("the true class gets 1 - eps instead of 1 - eps + eps / V: "
                                    "the smoothed target does not sum to 1", _LS_TARGET),
    "ls_pad_not_ignored": ("positions whose label is the pad id count in the loss",
                           "keep = target != pad_idx; loss = per_position[keep].mean()"),
    "ls_mean_over_all_positions": ("pad positions are zeroed but the sum is divided by all "
                                   "positions instead of the non-pad ones, so more padding "
                                   "means a smaller loss", "divide by keep.sum(), the number "
                                   "of non-pad labels: per_position[keep].mean()"),
    "ls_sum_not_mean": ("the loss is summed over positions instead of averaged",
                        "average over the non-pad positions: per_position[keep].mean()"),
    "ls_mean_over_classes": ("the loss is averaged over the classes as well as the positions "
                             "(a mean over the (M, V) matrix), so it is V times too small",
                             "sum over the classes first: per_position = -(q * log_p)"
                             ".sum(-1), then the mean over non-pad positions"),
    "ls_kl_divergence": ("the loss is the KL divergence KL(q || p), which is the cross-entropy "
                         "minus the entropy of q: same gradients, but its floor is 0, not H(q), "
                         "and its numbers are not comparable with nn.CrossEntropyLoss",
                         "return the cross-entropy -(q * log_softmax(logits)).sum(-1), "
                         "averaged over non-pad positions"),
    "ls_eps_ignored": ("no smoothing happens: the loss is the plain cross-entropy",
                       "mix eps into the target: " + _LS_TARGET),
    "ls_eps_hardcoded": ("eps is hard-coded (0.1) instead of taken from the eps argument",
                         "use the eps argument everywhere"),
    "ls_log_of_softmax": ("the log-probabilities are computed as log(softmax(logits)) (or "
                          "with a clamp): for a large logit gap the softmax underflows to 0 "
                          "and log(0) = -inf", "use torch.log_softmax(logits, dim=-1): it "
                          "subtracts the row maximum inside the log, so it never takes log(0)"),
    "loss_detached": ("the returned loss carries no gradient (.item(), numpy or "
                      "torch.tensor(...) on a result cuts the graph)",
                      "compute the loss with torch operations on logits and return the tensor"),
    # greedy decoding
    "decode_no_eval": ("the model decodes in train mode, so dropout is on and the tokens are "
                       "random", "call model.eval() before decoding (and restore the previous "
                       "mode afterwards: was_training = model.training ... "
                       "model.train(was_training))"),
    "decode_argmax_wrong_dim": ("the argmax runs over the positions axis instead of the "
                                "vocabulary", "logits = model.generator(hidden[:, -1]) is "
                                "(N, V); next_token = logits.argmax(dim=-1) is (N,)"),
    "decode_no_feedback": ("the generated token is not fed back: every step decodes the same "
                           "prefix (only BOS), or reads the first position's logits, which "
                           "see only BOS", "ys = torch.cat([ys, next_token[:, None]], dim=1); "
                           "decode ys at the next step and read hidden[:, -1]"),
    "decode_no_padding_after_eos": ("a row keeps generating after its EOS instead of being "
                                    "padded", "finished |= next_token == eos_idx; next_token "
                                    "= next_token.masked_fill(finished_before, pad_idx)"),
    "decode_stops_at_first_eos": ("decoding stops as soon as one row produces EOS; the other "
                                  "rows are cut short", "stop when every row has finished: "
                                  "if finished.all(): break"),
    "decode_pad_bos_not_excluded": ("PAD or BOS can be predicted: they are never labels, so "
                                    "they must be excluded from the argmax",
                                    "logits[:, [pad_idx, bos_idx]] = float('-inf') before the "
                                    "argmax"),
    "decode_max_len_off_by_one": ("the number of generated tokens is off by one: max_len "
                                  "counts generated tokens, not BOS", "for _ in range(max_len):"
                                  " at most max_len tokens after BOS (max_len + 1 columns)"),
    "decode_src_mask_missing": ("the decoder is called without the source padding mask, so "
                                "cross-attention reads padded memory positions",
                                "src_mask = tx.padding_mask(src, pad_idx); "
                                "model.decode(ys, memory, src_mask)"),
    "decode_no_lookahead": ("the decoder runs on the prefix without the look-ahead mask",
                            "let model.decode build tgt_mask (pass None), or pass "
                            "tx.decoder_self_mask(ys, pad_idx)"),
    "decode_no_bos_column": ("the output lacks the BOS column; tx.greedy_decode returns it in "
                             "column 0", "return ys, including ys[:, 0] == bos_idx"),
    # tied embeddings
    "embeddings_not_tied": ("with share_embeddings=True the source embedding, the target "
                            "embedding and the generator must be one Parameter",
                            "after building them: self.encoder.embedding.weight = "
                            "self.generator.weight; self.decoder.embedding.weight = "
                            "self.generator.weight"),
    "embeddings_copied_not_tied": ("the embedding matrices hold equal numbers but are separate "
                                   "Parameters (copied, not shared): they drift apart in "
                                   "training and take three times the memory",
                                   "assign the Parameter itself (a = b.weight), do not copy "
                                   "its data or wrap it in a new nn.Parameter"),
}
