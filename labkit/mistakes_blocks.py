"""Catalogue entries for the masks, positional encoding, feed-forward, layer, model and
training-step checks.

Kept apart from :mod:`.mistakes` (which merges them into ``MISTAKES``) so each file stays short.
Each hint names the idea behind the fix, never the fix itself (``tests/test_grading_hints.py``).
"""
from __future__ import annotations

BLOCKS: dict[str, tuple[str, str]] = {
    # masks
    "mask_not_bool": ("the mask is not a bool tensor",
                      "the masks of this project are boolean, True meaning 'do not attend'"),
    "mask_device_ignored": ("the mask is not built on the requested device (or on the "
                            "device of the token ids)",
                            "a mask should be created on the device it is asked for, or on the "
                            "device of the token ids it is built from"),
    "mask_rows_wrong": ("the mask hides the wrong keys for some queries",
                        "padding hides the pad keys for every query; look-ahead hides, for each "
                        "query, the keys that come after it"),
    "padding_mask_shape": ("the padding mask has no query axis",
                           "a padding mask needs a query axis of size one so that it broadcasts "
                           "over every query"),
    "padding_mask_keys_last_axis_missing": (
        "the padding mask has shape (N, L, 1) (unsqueeze(-1) or [..., None]): the pads sit on "
        "the query axis and the mask broadcasts over the keys, so it hides whole query rows "
        "and no pad key",
        "the new axis goes in the middle, (N, 1, L): one row of keys that every query shares"),
    "pad_idx_ignored": ("the pad id is hard-coded instead of taken from the pad_idx argument",
                        "the pad id is an argument: take it from there, never from a constant"),
    "padding_on_queries": ("padding masks the query rows instead of the key columns",
                           "a padding mask hides keys, the columns of the scores, not query rows"),
    "lookahead_diagonal_0": ("the look-ahead mask uses diagonal=0: the diagonal is masked too, "
                             "so a token cannot attend to itself (row 0 is fully masked)",
                             "a token may attend to itself: only the keys strictly after the "
                             "query are hidden"),
    "lookahead_diagonal_2": ("the look-ahead mask uses diagonal=2: each token also sees the "
                             "next token",
                             "a token may see itself and the past, and nothing after itself"),
    "lookahead_masks_past": ("the look-ahead mask hides the past instead of the future",
                             "look-ahead hides the future (the keys after the query), never the "
                             "past"),
    "decoder_mask_no_padding": ("the decoder mask has the look-ahead part but no padding",
                                "the decoder's self-attention mask hides a key that is padding or "
                                "that lies in the future"),
    "decoder_mask_no_lookahead": ("the decoder mask has the padding part but no look-ahead",
                                  "the decoder's self-attention mask hides a key that is padding "
                                  "or that lies in the future"),
    "decoder_mask_and": ("padding and look-ahead are combined with & (AND) instead of | (OR)",
                         "a key is hidden when either mask hides it: the union of the two, not "
                         "the intersection"),
    "cross_mask_shape": ("the cross-attention mask has shape (N, L_src, L_src): that is the "
                         "encoder's self-attention mask; cross-attention scores are "
                         "(N, H, L_tgt, L_src)",
                         "cross-attention's queries come from the target and its keys from the "
                         "source: the mask hides padded source keys for every target query"),
    "cross_mask_uses_tgt": ("the cross-attention mask is built from the target; it must hide "
                            "padded source (memory) positions",
                            "cross-attention's keys are the source (memory) positions, so the "
                            "mask is built from the source"),
    "cross_mask_lookahead": ("the cross-attention mask contains a look-ahead part; the decoder "
                             "may see every source position",
                             "the decoder may read the whole source: cross-attention hides source "
                             "padding only"),
    # positional encoding
    "pe_sin_cos_swapped": ("sin and cos are swapped: sin belongs on the even columns (0, 2, ...) "
                           "and cos on the odd ones",
                           "the paper puts sine on the even columns and cosine on the odd ones"),
    "pe_exponent_i": ("the frequency exponent uses the pair index i instead of 2i "
                      "(10000^(i/d_model))",
                      "the exponent of column pair i is 2i over d_model: it counts columns, not "
                      "pairs"),
    "pe_exponent_column": ("each column uses its own index j in the exponent (10000^(j/d_model)); "
                           "columns 2i and 2i+1 must share 10000^(2i/d_model)",
                           "the two columns of a pair (sine and cosine) share one frequency"),
    "pe_frequency_inverted": ("positions are multiplied by 10000^(2i/d_model) instead of divided",
                              "the wavelengths grow from 2 pi to 10000 times 2 pi: the position "
                              "is divided by the growing base power"),
    "pe_concatenated": ("sin and cos are concatenated as two halves instead of interleaved on "
                        "even/odd columns",
                        "sine and cosine alternate column by column, one pair per frequency, "
                        "rather than filling two halves"),
    "pe_positions_from_1": ("positions start at 1 instead of 0",
                            "the first position is 0"),
    "pe_dtype_ignored": ("the table does not come back in the dtype asked for (or the "
                         "function takes no dtype argument)",
                         "the dtype argument says what the caller receives; the computation "
                         "inside may use another precision and convert once at the end"),
    "pe_low_precision": ("the table is computed in low precision: angles of hundreds of radians "
                         "in float32 put errors of 1e-6 to 1e-4 into the far rows",
                         "the angles reach hundreds of radians, where float32's neighbouring "
                         "numbers lie far apart: compute the angles in float64 and round the "
                         "finished table once"),
    "pe_python_loop": ("the table is built with a Python loop over positions or columns",
                       "every entry is a function of one angle, a position times a "
                       "frequency: build all the angles at once by broadcasting a column of "
                       "positions against a row of frequencies"),
    "pe_start_ignored": ("forward(x, start) adds the rows of positions 0 .. L - 1, whatever "
                         "start says",
                         "a sequence that continues from position start holds positions start "
                         "onwards: its rows of the table begin there"),
    "pe_input_modified": ("forward adds the table into the caller's x in place (x += ...), "
                          "so the embeddings passed in are overwritten",
                          "a module's forward hands back a new tensor: the caller (and "
                          "autograd) may still need the x it passed in"),
    "pe_dropout_unused": ("in train mode the positional encoding's own dropout module is "
                          "never called: no dropout, or F.dropout in its place",
                          "the contract regularises the sum in training mode: the module's own "
                          "dropout has to see it"),
    "pe_dropout_misplaced": ("dropout acts on the wrong tensor, or more than once: the input "
                             "alone, the table rows alone, or twice",
                             "dropout regularises what the module hands on, the sum of the input "
                             "and its positions, and only once"),
    "pe_no_length_check": ("positions past max_len are not checked: the unchecked slice gives "
                           "fewer rows and the addition fails with a broadcasting error, or "
                           "nothing fails",
                           "slicing past the end of a tensor is not an error: compare the last "
                           "position with the table's length before slicing, and say what is "
                           "wrong"),
    "pe_length_off_by_one": ("a sequence that ends exactly at the table's last row is refused",
                             "a sequence may end exactly at the table's last row: refuse only "
                             "positions the table does not have"),
    "pe_length_message": ("the ValueError for positions past max_len does not name the length, "
                          "the start and max_len",
                          "a message a learner can act on gives the numbers that clash, so "
                          "the caller sees which one to change"),
    "pe_odd_d_model": ("the table fails or is wrong for an odd d_model: there is one cos "
                       "column fewer than sin columns",
                       "with an odd d_model there is one more sine column than cosine columns"),
    "pe_not_buffer": ("`pe` is not a registered buffer",
                      "the table is state that is not trained: look up how a module registers "
                      "such a tensor so that it moves with the module and is saved with it"),
    "pe_frequency": ("a column of the table has the wrong frequency",
                     "one frequency per pair of columns: base 10000, exponent 2i over d_model"),
    "pe_phase": ("a column of the table is sin where cos belongs (or the positions are "
                 "shifted)",
                 "sine on the even columns, cosine on the odd ones, and the first position is 0"),
    "pe_amplitude": ("a column of the table is scaled: sin and cos have amplitude 1",
                     "sine and cosine are stored as they are, with amplitude one"),
    "pe_column_wrong": ("a column of the table is not a sinusoid of the position",
                        "every column is a sine or a cosine of the position at its pair's "
                        "frequency"),
    "pe_input_changed": ("forward changes x instead of only adding the table",
                         "forward only adds the table (then dropout): the input itself is not "
                         "transformed"),
    "pe_scales_input": ("forward multiplies x by sqrt(d_model); that scaling belongs to the "
                        "embedding in the Encoder/Decoder",
                        "the scaling by the square root of d_model belongs to the embedding, "
                        "before the positional encoding"),
    "pe_seq_first": ("forward treats x as (L, N, d_model); the exercise uses (N, L, d_model)",
                     "the exercise's inputs are batch first (N, L, d_model); the table's rows are "
                     "positions"),
    # feed-forward
    "ffn_no_activation": ("there is no ReLU between linear1 and linear2",
                          "without a nonlinearity between them, two linear layers are one linear "
                          "map"),
    "ffn_other_activation": ("the activation is not ReLU (GELU?); the 2017 paper uses ReLU",
                             "the 2017 paper uses ReLU"),
    "ffn_activation_on_output": ("a ReLU is applied to the output of linear2 as well",
                                 "the block ends with its second linear layer: no activation "
                                 "after it"),
    "ffn_residual_inside": ("the feed-forward adds its input back: the residual belongs to the "
                            "layer around it",
                            "the residual belongs to the layer around the feed-forward block, not "
                            "to the block"),
    # layers
    "dropout_twice": ("dropout is applied twice to a sublayer's output (in train mode); eval "
                      "mode hides it",
                      "each sublayer output is dropped once (the paper's residual dropout)"),
    "dropout_after_residual": ("dropout is applied after the residual add, so it also drops "
                               "parts of the residual stream x",
                               "residual dropout acts on the sublayer's output before it is "
                               "added, so the residual stream itself is never dropped"),
    "residual_dropout_missing": ("there is no dropout on the sublayer outputs (the paper's "
                                 "residual dropout, P_drop = 0.1)",
                                 "the paper applies dropout to each sublayer's output before the "
                                 "residual add (P_drop is 0.1)"),
    "dropout_on_residual": ("dropout acts on the residual stream x, not on the sublayer's "
                            "output",
                            "only the sublayer's output is dropped; the residual stream passes "
                            "untouched"),
    "dropout_after_norm": ("dropout is applied after the LayerNorm, to the whole normalised "
                           "stream, so the next sublayer and the residual both see dropped "
                           "values",
                           "in Post-LN the sublayer's output is dropped before the residual add, "
                           "and the norm comes last"),
    "dropout_on_sublayer_input": ("dropout acts on the sublayer's input instead of its output",
                                  "residual dropout acts on what the sublayer returns, not on "
                                  "what it reads"),
    "pre_ln_instead_of_post_ln": ("Pre-LN order (LayerNorm before the sublayer, "
                                  "x + sublayer(norm(x))) where Post-LN is expected",
                                  "Post-LN, the paper's order: the norm comes after the residual "
                                  "add"),
    "post_ln_instead_of_pre_ln": ("Post-LN order (norm(x + sublayer(x))) where Pre-LN is "
                                  "expected",
                                  "Pre-LN: each sublayer reads a normalised copy of the stream, "
                                  "and the residual adds to the raw stream"),
    "norm_before_residual_add": ("the LayerNorm is applied to the sublayer output before the "
                                 "residual add (x + norm(sublayer(x)))",
                                 "neither layout normalises the sublayer's output alone: Post-LN "
                                 "normalises the sum of the residual and the sublayer's output, "
                                 "Pre-LN only what the sublayer reads (the sum is never "
                                 "normalised inside a Pre-LN layer)"),
    "missing_residual": ("a residual connection is missing",
                         "every sublayer's input is added back to its output"),
    "norms_mixed_up": ("the LayerNorms are used in the wrong sublayers (or one is shared)",
                       "each sublayer has a norm of its own, numbered in the order of the "
                       "sublayers"),
    "sublayers_out_of_order": ("the sublayers run in the wrong order",
                               "self-attention first, then (in the decoder) cross-attention, then "
                               "the feed-forward network"),
    "mask_not_passed": ("the mask is not passed to self-attention",
                        "self-attention in the encoder must receive the layer's mask"),
    "tgt_mask_not_passed": ("tgt_mask is not passed to the decoder self-attention",
                            "the decoder's self-attention must receive the target mask"),
    "memory_mask_not_passed": ("memory_mask is not passed to cross-attention",
                               "cross-attention must receive the memory mask"),
    "cross_attn_on_x": ("cross-attention attends to the decoder states x instead of memory",
                        "in cross-attention the queries come from the decoder and the keys and "
                        "values from the encoder's memory"),
    "masks_swapped": ("tgt_mask and memory_mask are swapped: the layer works when the check "
                      "passes them the other way round",
                      "self-attention gets the target mask and cross-attention the memory mask, "
                      "in the order of the signature"),
    "self_attn_reused_for_cross": ("self_attn is called for cross-attention; cross_attn has "
                                   "its own weights",
                                   "cross-attention has weights of its own, separate from "
                                   "self-attention's"),
    # transformer
    "embeddings_not_scaled": ("the embeddings are not multiplied by sqrt(d_model)",
                              "the paper multiplies the embeddings by the square root of d_model "
                              "before the positional encoding"),
    "embedding_scale_hard_coded": ("the embeddings are scaled by the square root of a fixed "
                                   "width (128 or 512), not of the d_model the module was built "
                                   "with",
                                   "the scale follows the width of this module, which the check "
                                   "builds at another size than the notebook's"),
    "no_final_norm": ("the final LayerNorm after the last encoder/decoder layer is missing",
                      "with Post-LN this project's stacks end with one more LayerNorm after the "
                      "last layer"),
    "no_generator": ("the output has d_model features: the generator (the final Linear to the "
                     "target vocabulary) is missing",
                     "the model ends with the generator: a linear layer from d_model to the "
                     "target vocabulary"),
    "returns_probabilities": ("forward returns (log-)probabilities instead of raw logits",
                              "the model returns raw logits: the loss applies the log-softmax "
                              "itself"),
    "decoder_sees_future": ("changing a later target token changes earlier outputs: the "
                            "decoder sees the future",
                            "every decoder layer's self-attention needs the look-ahead part of "
                            "the target mask"),
    "source_padding_leaks": ("changing source tokens under the padding mask changes the "
                             "output: src_mask is not applied everywhere",
                             "the source padding mask must reach every encoder layer and every "
                             "decoder layer's cross-attention"),
    # training step
    "no_update": ("the parameters did not change: loss.backward() or optimizer.step() is "
                  "missing",
                  "a step computes the gradients and then lets the optimizer apply them"),
    "no_zero_grad": ("the gradients are never zeroed, so each step adds its gradients to the "
                     "previous steps' ones",
                     "PyTorch adds new gradients to the stored ones: each step must start from "
                     "zero gradients"),
    "no_clipping": ("the gradients are not clipped before optimizer.step()",
                    "the step clips the gradient norm to clip_norm, after the gradients exist and "
                    "before the update"),
    "scheduler_not_stepped": ("the learning-rate scheduler is never stepped: the warmup never "
                              "advances",
                              "the learning-rate schedule advances once per step, after the "
                              "update"),
    "scheduler_before_optimizer": ("scheduler.step() runs before optimizer.step(), so every "
                                   "step uses the next step's learning rate (PyTorch warns)",
                                   "the schedule advances after the optimizer's update, so each "
                                   "update uses its own step's rate"),
    "decoder_reads_labels": ("the decoder reads tgt_out (the labels) instead of tgt_in, so it "
                             "can copy the answer",
                             "teacher forcing: the decoder reads the target shifted right "
                             "(starting with BOS), never the labels"),
    "labels_not_shifted": ("the loss compares the logits with tgt_in instead of tgt_out: the "
                           "labels are not shifted",
                           "the labels are the target shifted left: each position predicts the "
                           "token after it"),
    "grad_norm_after_clip": ("the returned gradient norm is measured after clipping (it equals "
                             "clip_norm)",
                             "the norm to report is the one measured before clipping, which the "
                             "clipping function returns"),
    "wrong_return": ("the step does not return what tx.train_step returns: a dict with the "
                     "loss and the gradient norm as numbers",
                     "return what the reference step returns: a dict with the loss and the "
                     "gradient norm as Python numbers"),
}
