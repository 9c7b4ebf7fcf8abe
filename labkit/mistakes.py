"""The catalogue of mistakes the checks can name: a stable key -> (what went wrong, the fix).

Checks add details to the text. ``docs/teaching.md`` lists every key (a test keeps it so).
"""
from __future__ import annotations

_SPLIT_HINT = ("split heads with x.view(N, L, H, d_k).transpose(1, 2) and merge them back with "
               "context.transpose(1, 2).contiguous().view(N, L, d_model)")
_MASK_FILL_HINT = ("fill the masked scores before the softmax: "
                   "scores.masked_fill(mask, torch.finfo(scores.dtype).min) (or -1e9)")

# key -> (what went wrong, how to fix it). Checks add details to the text.
MISTAKES: dict[str, tuple[str, str]] = {
    # exceptions
    "not_implemented": ("this exercise is not implemented yet",
                        "replace the `raise NotImplementedError(...)` line with your code, "
                        "run the cell, then run this check again"),
    "missing_contiguous": ("`.view()` was called on a non-contiguous tensor (after a transpose)",
                           "call .contiguous() after transpose, or use reshape"),
    "shape_error": ("a shape mismatch inside your code", "compare your shapes with the "
                    "expected ones above; print x.shape at each step"),
    "signature": ("your class or function does not take the arguments the check passes",
                  "keep the signature given in the exercise"),
    "attribute_error": ("an attribute is missing", "set it in __init__ (self.name = ...); "
                        "the checks rely on the attribute names of the exercise"),
    "exception": ("your code raised an exception", "read the message and the line shown"),
    "device_mismatch": ("tensors on different devices", "the checks run on the CPU: create "
                        "new tensors on the input's device (device=x.device), not on a fixed "
                        "one"),
    "not_a_class": ("an instance was passed where the class is expected",
                    "pass the class itself, e.g. check(MyModule), not check(MyModule(...))"),
    "missing_weights": ("some parameters were not found under the expected names",
                        "use the attribute names of the exercise (w_q, w_k, w_v, w_o, "
                        "linear1, linear2, self_attn, cross_attn, feed_forward, norm1, ...)"),
    "wrong_output_shape": ("the output has the wrong shape", "compare with the expected shape"),
    "wrong_output_type": ("the output is not a tensor", "return a torch.Tensor"),
    "nan_output": ("the output contains NaN or inf", "look for a division by zero or a "
                   "softmax over a row filled entirely with -inf"),
    "dropout_in_eval": ("two identical calls in eval mode gave different outputs: dropout (or "
                        "other randomness) is active in eval mode",
                        "use an nn.Dropout module (it switches off in .eval()), or "
                        "F.dropout(x, p, training=self.training)"),
    "submodule_differs": ("one of your submodules already differs from the reference",
                          "fix that building block first (its own check names the mistake)"),
    # attention
    "no_scaling": ("the scores are not scaled: softmax(q @ k^T) without dividing by sqrt(d_k)",
                   "divide the scores by math.sqrt(d_k), with d_k = q.size(-1)"),
    "scale_d_k": ("the scores are divided by d_k instead of sqrt(d_k)",
                  "divide by math.sqrt(d_k)"),
    "scale_sqrt_d_model": ("the scores are divided by sqrt(d_model) instead of sqrt(d_k); "
                           "d_k = d_model / n_heads is the size of one head",
                           "divide by math.sqrt(self.d_k)"),
    "scale_other": ("the scores are scaled by the wrong factor", "divide by math.sqrt(d_k)"),
    "softmax_wrong_axis": ("the softmax runs over the wrong axis: each query's weights over the "
                           "keys must sum to 1", "use torch.softmax(scores, dim=-1)"),
    "mask_inverted": ("the mask semantics are inverted: positions marked True were attended and "
                      "the others masked", "in this project True means 'do not attend': "
                      "scores.masked_fill(mask, ...) masks where the mask is True"),
    "mask_ignored": ("the mask is ignored: masked positions still get attention weight",
                     _MASK_FILL_HINT),
    "mask_fill_zero": ("masked scores are filled with 0, which still gives them weight after "
                       "the softmax", "fill with a very negative number "
                       "(torch.finfo(scores.dtype).min or -1e9), not 0"),
    "mask_after_softmax": ("the mask is applied after the softmax: the weights are zeroed but "
                           "the rows no longer sum to 1", "mask the scores before the softmax"),
    "weights_times_k": ("the attention weights multiply k instead of v", "return weights @ v"),
    # multi-head attention
    "heads_view_without_transpose": ("the heads are split with view alone, without transpose: "
                                     "positions and features get mixed, or attention runs "
                                     "across heads instead of positions", _SPLIT_HINT),
    "heads_merge_without_transpose": ("the heads are merged back with view alone, without "
                                      "transposing (N, H, L, d_k) back to (N, L, H, d_k)",
                                      _SPLIT_HINT),
    "no_output_projection": ("w_o is not used: the merged heads are returned without the "
                             "output projection", "return self.w_o(context)"),
    "unused_projection": ("a projection layer is not used", "project query, key and value with "
                          "their own layer: q = self.w_q(query), k = self.w_k(key), "
                          "v = self.w_v(value)"),
    "key_value_swapped": ("key and value are swapped: the scores use the value tensor and the "
                          "output mixes the key tensor", "q = self.w_q(query), "
                          "k = self.w_k(key), v = self.w_v(value); forward(query, key, value)"),
    "scale_d_v": ("the scores are divided by sqrt(d_v), the size of the values (v.size(-1)); "
                  "the scale is sqrt(d_k), the size of the queries and keys",
                  "d_k = q.size(-1); scores = q @ k.transpose(-2, -1) / math.sqrt(d_k)"),
    "mask_needs_head_axis": ("a 3-D mask (N, L_q, L_k) or (N, 1, L_k) does not broadcast over "
                             "the heads", "add the head axis inside forward: "
                             "mask = mask.unsqueeze(1) gives (N, 1, L_q, L_k)"),
    # found by the localising probes (labkit/localize.py)
    "attention_values_wrong": ("the output is not the attention weights applied to v",
                               "return weights @ v, with weights = softmax(scores, dim=-1)"),
    "attention_rows_not_normalised": ("each query's weights over the keys do not sum to 1",
                                      "weights = torch.softmax(scores, dim=-1)"),
    "attention_weights_not_softmax": ("the weights are not a softmax of the scaled scores",
                                      "weights = torch.softmax(q @ k.transpose(-2, -1) / "
                                      "math.sqrt(d_k), dim=-1)"),
    "mask_fill_weak": ("masked keys still get some weight: the fill value is not negative "
                       "enough (or it is added instead of filled)", _MASK_FILL_HINT),
    "mask_other": ("with a mask, the weights over the unmasked keys are not a softmax over "
                   "those keys alone", _MASK_FILL_HINT),
    "heads_split_wrong": ("the heads split or merge mixes positions and features", _SPLIT_HINT),
    "projection_inputs_wrong": ("a projection is applied to the wrong input tensor",
                                "q = self.w_q(query), k = self.w_k(key), v = self.w_v(value)"),
    "mha_output_changed": ("the module changes w_o's output before returning it",
                           "return self.w_o(context)"),
    "ffn_input_changed": ("linear1 does not receive the block's input x", "linear1(x)"),
    "ffn_activation_wrong": ("the activation between linear1 and linear2 is not ReLU",
                             "linear2(dropout(relu(linear1(x))))"),
    "ffn_output_changed": ("linear2's output is changed before it is returned",
                           "return linear2(...) as it is"),
    "ffn_hidden_width": ("the hidden layer does not have d_ff units",
                         "linear1 = nn.Linear(d_model, d_ff); linear2 = nn.Linear(d_ff, d_model)"),
    "sublayer_calls": ("a sublayer is called more or fewer times than once per forward pass",
                       "call each sublayer once: its output goes into the residual add"),
    "sublayer_input_wrong": ("a sublayer receives the wrong input", "follow the stream: each "
                             "sublayer reads the output of the step before it"),
    "sublayer_output_dropped": ("a sublayer's output never reaches the residual stream",
                                "x = norm(x + dropout(sublayer(x))): keep the result"),
    "pe_not_added": ("the positional encoding is not added to the embeddings",
                     "x = self.pos_encoding(self.embedding(tokens) * math.sqrt(d_model))"),
    "embedding_scale_wrong": ("the embeddings are scaled by the wrong factor",
                              "multiply by math.sqrt(d_model)"),
    "embedding_stage_wrong": ("the first layer does not receive embedding x sqrt(d_model) + PE",
                              "x = self.pos_encoding(self.embedding(tokens) * "
                              "math.sqrt(d_model))"),
    "layers_not_chained": ("a layer does not receive the previous layer's output",
                           "for layer in self.layers: x = layer(x, mask)"),
    "memory_wrong": ("the decoder does not receive the encoder's output as memory",
                     "memory = self.encoder(src, src_mask); self.decoder(tgt, memory, ...)"),
    "generator_input_wrong": ("the generator does not receive the decoder's output",
                              "return self.generator(self.decoder(...))"),
    "output_changed": ("the generator's output is changed before it is returned",
                       "return the logits: self.generator(hidden)"),
    "layer_mask_differs": ("a layer is given a mask that hides other positions than it should",
                           "encoder layers: the source padding mask; decoder self-attention: "
                           "padding OR look-ahead"),
    "ffn_no_bias": ("the feed-forward's Linears have no bias; the paper's FFN(x) = "
                    "max(0, x W1 + b1) W2 + b2 has both", "nn.Linear(d_model, d_ff) (bias=True "
                    "is the default)"),
    "layers_shared": ("the stack repeats one layer object: every layer shares the same weights",
                      "build N separate layers: nn.ModuleList([Layer(...) for _ in range(N)]) "
                      "(copy.deepcopy of a template also works)"),
    "pe_same_rows": ("every position gets the same row of the table: the position is not used",
                     "angle = position * frequency, with position = torch.arange(max_len) as a "
                     "column (max_len, 1)"),
    "attention_log_weights": ("the attention weights are log-probabilities (log_softmax), not "
                              "probabilities", "weights = torch.softmax(scores, dim=-1)"),
    "mask_transposed": ("the mask is transposed: it hides queries where it should hide keys "
                        "(or the reverse)", "keep (N, L_q, L_k): query rows, key columns"),
    "ffn_dropout_position": ("in train mode, dropout acts in the wrong place in the "
                             "feed-forward: the layer around it already drops the sublayer's "
                             "output", "linear2(dropout(relu(linear1(x)))): dropout on the "
                             "hidden layer only (or none)"),
    "mask_wrong_batch": ("the mask reaches the wrong batch element (or head)",
                         "mask.unsqueeze(1) broadcasts (N, 1, L_q, L_k) over the heads; if you "
                         "flatten to (N*H, ...), repeat the mask with repeat_interleave(H, 0)"),
    "layernorm_missing": ("a LayerNorm is missing after a sublayer's residual add",
                          "x = norm(x + dropout(sublayer(x))) for every sublayer"),
    "residual_doubled": ("a sublayer's output is added to the stream twice",
                         "x = norm(x + dropout(sublayer(x)))"),
    "residual_wrong": ("the residual add and LayerNorm around a sublayer are not the paper's",
                       "Post-LN: x = norm(x + dropout(sublayer(x)))"),
    # masks
    "mask_not_bool": ("the mask is not a bool tensor", "build it with comparisons or "
                      "dtype=torch.bool; True means 'do not attend'"),
    "mask_device_ignored": ("the mask is not built on the requested device (or on the "
                            "device of the token ids)", "torch.ones(L, L, dtype=torch.bool, "
                            "device=device); in functions that take token ids, "
                            "device=tgt.device"),
    "mask_rows_wrong": ("the mask hides the wrong keys for some queries",
                        "padding: hide the pad keys for every query; look-ahead: hide keys "
                        "j > i for query i (torch.triu(..., diagonal=1))"),
    "padding_mask_shape": ("the padding mask has no query axis", "return "
                           "(seq == pad_idx).unsqueeze(1), shape (N, 1, L): it broadcasts "
                           "over every query"),
    "pad_idx_ignored": ("the pad id is hard-coded instead of taken from the pad_idx argument",
                        "compare with the pad_idx argument: seq == pad_idx"),
    "padding_on_queries": ("padding masks the query rows instead of the key columns",
                           "a padding mask hides keys: shape (N, 1, L_k) broadcasts over "
                           "the query rows"),
    "lookahead_diagonal_0": ("the look-ahead mask uses diagonal=0: the diagonal is masked too, "
                             "so a token cannot attend to itself (row 0 is fully masked)",
                             "torch.triu(torch.ones(L, L, dtype=torch.bool), diagonal=1)"),
    "lookahead_diagonal_2": ("the look-ahead mask uses diagonal=2: each token also sees the "
                             "next token", "torch.triu(torch.ones(L, L, dtype=torch.bool), "
                             "diagonal=1)"),
    "lookahead_masks_past": ("the look-ahead mask hides the past instead of the future",
                             "mask strictly above the diagonal: torch.triu(..., diagonal=1)"),
    "decoder_mask_no_padding": ("the decoder mask has the look-ahead part but no padding",
                                "combine both: padding_mask(tgt, pad_idx) | lookahead_mask(L)"),
    "decoder_mask_no_lookahead": ("the decoder mask has the padding part but no look-ahead",
                                  "combine both: padding_mask(tgt, pad_idx) | "
                                  "lookahead_mask(L)"),
    "decoder_mask_and": ("padding and look-ahead are combined with & (AND) instead of | (OR)",
                         "a position is hidden if either mask hides it: pad | causal"),
    "cross_mask_shape": ("the cross-attention mask has shape (N, L_src, L_src): that is the "
                         "encoder's self-attention mask; cross-attention scores are "
                         "(N, H, L_tgt, L_src)", "use the source key-padding mask "
                         "(N, 1, L_src): it broadcasts over the L_tgt queries"),
    "cross_mask_uses_tgt": ("the cross-attention mask is built from the target; it must hide "
                            "padded source (memory) positions", "padding_mask(src, pad_idx)"),
    "cross_mask_lookahead": ("the cross-attention mask contains a look-ahead part; the decoder "
                             "may see every source position", "use only the source padding "
                             "mask for cross-attention"),
    # positional encoding
    "pe_sin_cos_swapped": ("sin and cos are swapped: sin belongs on the even columns (0, 2, ...) "
                           "and cos on the odd ones", "pe[:, 0::2] = sin(...); "
                           "pe[:, 1::2] = cos(...)"),
    "pe_exponent_i": ("the frequency exponent uses the pair index i instead of 2i "
                      "(10000^(i/d_model))", "use 10000^(2i/d_model): "
                      "torch.arange(0, d_model, 2) / d_model as the exponent"),
    "pe_exponent_column": ("each column uses its own index j in the exponent (10000^(j/d_model)); "
                           "columns 2i and 2i+1 must share 10000^(2i/d_model)",
                           "compute one frequency per pair: torch.arange(0, d_model, 2)"),
    "pe_frequency_inverted": ("positions are multiplied by 10000^(2i/d_model) instead of divided",
                              "angle = pos / 10000^(2i/d_model) = pos * exp(-2i ln(10000) / "
                              "d_model)"),
    "pe_concatenated": ("sin and cos are concatenated as two halves instead of interleaved on "
                        "even/odd columns", "pe[:, 0::2] = sin(...); pe[:, 1::2] = cos(...)"),
    "pe_positions_from_1": ("positions start at 1 instead of 0", "torch.arange(max_len)"),
    "pe_odd_d_model": ("the table fails or is wrong for an odd d_model: there is one cos "
                       "column fewer than sin columns", "pe[:, 1::2] = torch.cos(angles"
                       "[:, : d_model // 2]) (the sin columns take all of them)"),
    "pe_not_buffer": ("`pe` is not a registered buffer", "self.register_buffer('pe', table): a "
                      "buffer moves with .to(), is saved in state_dict and is never trained"),
    "pe_frequency": ("a column of the table has the wrong frequency",
                     "angle = pos / 10000^(2i/d_model): one frequency per pair of columns "
                     "(2i, 2i+1), base 10000, exponent 2i/d_model"),
    "pe_phase": ("a column of the table is sin where cos belongs (or the positions are "
                 "shifted)", "pe[:, 0::2] = sin(pos * freq); pe[:, 1::2] = cos(pos * freq), "
                 "with pos = torch.arange(max_len) starting at 0"),
    "pe_amplitude": ("a column of the table is scaled: sin and cos have amplitude 1",
                     "store sin(angle) and cos(angle) as they are"),
    "pe_column_wrong": ("a column of the table is not a sinusoid of the position",
                        "every column is sin or cos of pos / 10000^(2i/d_model)"),
    "pe_input_changed": ("forward changes x instead of only adding the table",
                         "return self.dropout(x + self.pe[:x.size(1)])"),
    "pe_scales_input": ("forward multiplies x by sqrt(d_model); that scaling belongs to the "
                        "embedding in the Encoder/Decoder", "return x + self.pe[:L] "
                        "(then dropout)"),
    "pe_seq_first": ("forward treats x as (L, N, d_model); the exercise uses (N, L, d_model)",
                     "add self.pe[:x.size(1)] (shape (L, d_model)), which broadcasts over N"),
    # feed-forward
    "ffn_no_activation": ("there is no ReLU between linear1 and linear2",
                          "linear2(dropout(relu(linear1(x))))"),
    "ffn_other_activation": ("the activation is not ReLU (GELU?); the 2017 paper uses ReLU",
                             "use F.relu"),
    "ffn_activation_on_output": ("a ReLU is applied to the output of linear2 as well",
                                 "return linear2(...) without an activation"),
    "ffn_residual_inside": ("the feed-forward adds its input back: the residual belongs to the "
                            "layer around it", "return only linear2(...)"),
    # layers
    "dropout_twice": ("dropout is applied twice to a sublayer's output (in train mode); eval "
                      "mode hides it", "one dropout per sublayer output: "
                      "norm(x + dropout(sublayer(x)))"),
    "dropout_after_residual": ("dropout is applied after the residual add, so it also drops "
                               "parts of the residual stream x", "drop the sublayer output "
                               "before adding it: norm(x + dropout(sublayer(x)))"),
    "residual_dropout_missing": ("there is no dropout on the sublayer outputs (the paper's "
                                 "residual dropout, P_drop = 0.1)", "x = norm(x + "
                                 "self.dropout1(sublayer(x))), and likewise for each sublayer"),
    "dropout_on_residual": ("dropout acts on the residual stream x, not on the sublayer's "
                            "output", "norm(x + dropout(sublayer(x))): only the sublayer's "
                            "output is dropped"),
    "dropout_on_sublayer_input": ("dropout acts on the sublayer's input instead of its output",
                                  "norm(x + dropout(sublayer(x))): drop what the sublayer "
                                  "returns"),
    "pre_ln_instead_of_post_ln": ("Pre-LN order (LayerNorm before the sublayer, "
                                  "x + sublayer(norm(x))) where Post-LN is expected",
                                  "Post-LN (the paper): x = norm(x + dropout(sublayer(x)))"),
    "post_ln_instead_of_pre_ln": ("Post-LN order (norm(x + sublayer(x))) where Pre-LN is "
                                  "expected", "Pre-LN: x = x + dropout(sublayer(norm(x)))"),
    "norm_before_residual_add": ("the LayerNorm is applied to the sublayer output before the "
                                 "residual add (x + norm(sublayer(x)))",
                                 "Post-LN normalises the sum: norm(x + sublayer(x))"),
    "missing_residual": ("a residual connection is missing", "add the sublayer's input back: "
                         "norm(x + dropout(sublayer(x)))"),
    "norms_mixed_up": ("the LayerNorms are used in the wrong sublayers (or one is shared)",
                       "norm1 after self-attention, norm2 after the next sublayer, ..."),
    "sublayers_out_of_order": ("the sublayers run in the wrong order", "self-attention first, "
                               "(cross-attention next,) feed-forward last"),
    "mask_not_passed": ("the mask is not passed to self-attention",
                        "self.self_attn(x, x, x, mask)"),
    "tgt_mask_not_passed": ("tgt_mask is not passed to the decoder self-attention",
                            "self.self_attn(x, x, x, tgt_mask)"),
    "memory_mask_not_passed": ("memory_mask is not passed to cross-attention",
                               "self.cross_attn(x, memory, memory, memory_mask)"),
    "cross_attn_on_x": ("cross-attention attends to the decoder states x instead of memory",
                        "self.cross_attn(x, memory, memory, memory_mask): queries from the "
                        "decoder, keys and values from the encoder memory"),
    "masks_swapped": ("tgt_mask and memory_mask are swapped: the layer works when the check "
                      "passes them the other way round", "forward(x, memory, tgt_mask, "
                      "memory_mask): self-attention gets tgt_mask, cross-attention memory_mask"),
    "self_attn_reused_for_cross": ("self_attn is called for cross-attention; cross_attn has "
                                   "its own weights", "use self.cross_attn for the second "
                                   "sublayer"),
    # transformer
    "embeddings_not_scaled": ("the embeddings are not multiplied by sqrt(d_model)",
                              "x = self.embedding(tokens) * math.sqrt(d_model) before the "
                              "positional encoding"),
    "no_final_norm": ("the final LayerNorm after the last encoder/decoder layer is missing",
                      "apply self.norm(x) after the loop over layers"),
    "no_generator": ("the output has d_model features: the generator (the final Linear to the "
                     "target vocabulary) is missing", "self.generator = "
                     "nn.Linear(d_model, tgt_vocab_size); return self.generator(hidden)"),
    "returns_probabilities": ("forward returns (log-)probabilities instead of raw logits",
                              "return the generator's logits; CrossEntropyLoss applies "
                              "log-softmax itself"),
    "decoder_sees_future": ("changing a later target token changes earlier outputs: the "
                            "decoder sees the future", "pass tgt_mask (padding | look-ahead) "
                            "to every decoder layer's self-attention"),
    "source_padding_leaks": ("changing source tokens under the padding mask changes the "
                             "output: src_mask is not applied everywhere",
                             "pass src_mask to every encoder layer and as memory_mask to "
                             "every decoder layer"),
    # training step
    "no_update": ("the parameters did not change: loss.backward() or optimizer.step() is "
                  "missing", "loss.backward(), then optimizer.step()"),
    "no_zero_grad": ("the gradients are never zeroed, so each step adds its gradients to the "
                     "previous steps' ones", "call optimizer.zero_grad() before loss.backward()"),
    "no_clipping": ("the gradients are not clipped before optimizer.step()",
                    "nn.utils.clip_grad_norm_(model.parameters(), clip_norm) between "
                    "loss.backward() and optimizer.step()"),
    "scheduler_not_stepped": ("the learning-rate scheduler is never stepped: the warmup never "
                              "advances", "call scheduler.step() once per step, after "
                              "optimizer.step()"),
    "scheduler_before_optimizer": ("scheduler.step() runs before optimizer.step(), so every "
                                   "step uses the next step's learning rate (PyTorch warns)",
                                   "optimizer.step() first, then scheduler.step()"),
    "decoder_reads_labels": ("the decoder reads tgt_out (the labels) instead of tgt_in, so it "
                             "can copy the answer", "logits = model(src, tgt_in)"),
    "labels_not_shifted": ("the loss compares the logits with tgt_in instead of tgt_out: the "
                           "labels are not shifted", "criterion(logits.reshape(-1, V), "
                           "tgt_out.reshape(-1))"),
    "grad_norm_after_clip": ("the returned gradient norm is measured after clipping (it equals "
                             "clip_norm)", "return what clip_grad_norm_ returns: the norm before "
                             "clipping"),
    "wrong_return": ("the step does not return what tx.train_step returns: a dict with the "
                     "loss and the gradient norm as numbers",
                     "return {\"loss\": loss.item(), \"grad_norm\": grad_norm.item()}"),
    "checker_failed": ("the check itself failed on your code; this says nothing about whether "
                       "your code is right", "compare your output with the tx_helpers version "
                       "by hand, and tell the course authors which layout broke the check"),
    "mismatch": ("the numbers differ from the reference and match none of the known mistakes",
                 "print intermediate shapes and values and compare them with tx_helpers"),
}


from .mistakes_loss_decoding import LOSS_AND_DECODING  # noqa: E402 - kept in its own file

MISTAKES.update(LOSS_AND_DECODING)

from .mistakes_beam import BEAM  # noqa: E402 - kept in its own file

MISTAKES.update(BEAM)
