"""The catalogue of mistakes the checks can name: a stable key -> (what went wrong, a hint).

Checks add details to the text. ``docs/teaching.md`` lists every key (a test keeps it so).
A hint names the idea behind the fix, never the fix: no code, no formula to copy
(``tests/test_grading_hints.py`` defines what counts as code).
"""
from __future__ import annotations

# key -> (what went wrong, the idea behind the fix). Checks add details to the text.
MISTAKES: dict[str, tuple[str, str]] = {
    # exceptions
    "not_implemented": ("this exercise is not implemented yet",
                        "the stub still raises: put your own code in its place, run that cell, "
                        "then run this check again"),
    "missing_contiguous": ("`.view()` was called on a non-contiguous tensor (after a transpose)",
                           "a transpose only changes the strides, so the data is no longer stored "
                           "in the new order; look up which reshaping needs contiguous memory and "
                           "which copies when it must"),
    "shape_error": ("a shape mismatch inside your code",
                    "compare each intermediate shape with the expected shapes above; the first "
                    "one that differs is where an axis went astray"),
    "signature": ("your class or function does not take the arguments the check passes",
                  "the check calls your code with the arguments the exercise states: keep its "
                  "parameter names and their order"),
    "attribute_error": ("an attribute is missing",
                        "the checks find your layers by the attribute names of the exercise: "
                        "create each one in the constructor under that name"),
    "exception": ("your code raised an exception",
                  "read the message and the line shown: that line is where your code stopped"),
    "device_mismatch": ("tensors on different devices",
                        "the checks run on the CPU: a tensor your code creates should live on the "
                        "device of the tensors it meets, never on a fixed one"),
    "not_a_class": ("an instance was passed where the class is expected",
                    "pass the class itself, not an instance of it: the check builds its own "
                    "instances with its own sizes"),
    "missing_weights": ("some parameters were not found under the expected names",
                        "the checks place their weights by the attribute names of the exercise "
                        "(the projections, the two linear layers, the sublayers, the norms): keep "
                        "those names"),
    "wrong_output_shape": ("the output has the wrong shape",
                           "compare with the expected shape: which axis is missing, extra or out "
                           "of place?"),
    "wrong_output_type": ("the output is not a tensor",
                          "the caller expects a tensor, not a Python number, list or tuple"),
    "nan_output": ("the output contains NaN or inf",
                   "NaN usually comes from a division by zero, or from a softmax over a row in "
                   "which every score is minus infinity"),
    "dropout_in_eval": ("two identical calls in eval mode gave different outputs: dropout (or "
                        "other randomness) is active in eval mode",
                        "dropout belongs to training only: a dropout module follows the mode of "
                        "the model it sits in, a bare functional call does not unless it is told "
                        "the mode"),
    "submodule_differs": ("one of your submodules already differs from the reference",
                          "fix that building block first: its own check names the mistake"),
    # attention
    "no_scaling": ("the scores are not scaled: softmax(q @ k^T) without dividing by sqrt(d_k)",
                   "the paper's scaled dot-product attention: dot products of d_k-dimensional "
                   "vectors grow with d_k, and large scores saturate the softmax"),
    "scale_d_k": ("the scores are divided by d_k instead of sqrt(d_k)",
                  "the scale undoes the growth of a dot product's spread, which is the square "
                  "root of d_k, not d_k itself"),
    "scale_sqrt_d_model": ("the scores are divided by sqrt(d_model) instead of sqrt(d_k); "
                           "d_k = d_model / n_heads is the size of one head",
                           "the scores are dot products within one head, of vectors of size d_k "
                           "(d_model split over the heads)"),
    "scale_other": ("the scores are scaled by the wrong factor",
                    "the paper's scale factor depends only on the size of one head's query and "
                    "key vectors"),
    "softmax_wrong_axis": ("the softmax runs over the wrong axis: each query's weights over the "
                           "keys must sum to 1",
                           "each query distributes its attention over the keys: the normalised "
                           "axis is the key axis"),
    "mask_inverted": ("the mask semantics are inverted: positions marked True were attended and "
                      "the others masked",
                      "in this project a True entry means 'do not attend': masked positions are "
                      "those where the mask is True"),
    "mask_ignored": ("the mask is ignored: masked positions still get attention weight",
                     "masking happens on the scores, before the softmax, so that hidden keys get "
                     "no weight at all"),
    "mask_fill_zero": ("masked scores are filled with 0, which still gives them weight after "
                       "the softmax",
                       "a score of zero still gets weight after the softmax; a hidden key needs a "
                       "score the softmax turns into (almost) nothing"),
    "mask_after_softmax": ("the mask is applied after the softmax: the weights are zeroed but "
                           "the rows no longer sum to 1",
                           "hiding keys after the softmax leaves rows that no longer sum to one: "
                           "hide them on the scores"),
    "weights_times_k": ("the attention weights multiply k instead of v",
                        "the weights mix the values, one row of weights per query"),
    "mask_fill_inf": ("masked scores are filled with -inf: a query whose keys are all masked "
                      "gets NaN weights (the softmax divides 0 by 0), and NaN spreads through the "
                      "model",
                      "the contract's fill is the most negative finite number of the scores' "
                      "dtype: a row of equal finite scores gives uniform weights, never NaN"),
    "mask_row_zeroed": ("a query whose keys are all masked gets zero output; this project's "
                        "contract gives it uniform weights (PyTorch's fused attention zeroes "
                        "such rows instead)",
                        "fill the masked scores with the dtype's most negative finite number and "
                        "let the softmax normalise every row, fully masked ones included"),
    "mask_fill_overflow": ("the fill value does not fit float16: a constant such as -1e9 or "
                           "float32's minimum overflows in half precision (defect 8)",
                           "ask the scores' own dtype for its most negative finite number, so the "
                           "fill fits whatever precision the model runs in"),
    "mask_fill_half_inf": ("in float16 the fill is -inf: a constant such as -1e9 turned into a "
                           "float16 tensor rounds to -inf, so a query whose keys are all masked "
                           "gets NaN (defect 8)",
                           "ask the scores' own dtype for its most negative finite number; a "
                           "constant typed for float32 does not fit float16"),
    "attn_dropout_unused": ("the dropout module passed to the function is never called",
                            "the module decides by its own train or eval mode whether to drop: "
                            "call the module it was given, on the weights"),
    "attn_dropout_on_output": ("dropout is applied to the attention output, not to the weights",
                               "the paper's attention dropout zeroes some weights of each "
                               "query's row, before the weights mix the values"),
    "attn_dropout_twice": ("the dropout module is called more than once in one attention call",
                           "one attention call drops the weights once"),
    "attn_dropout_before_softmax": ("dropout is applied to the scores, before the softmax",
                                    "dropout acts on the normalised weights, after the softmax; "
                                    "a zeroed score still gets weight"),
    # multi-head attention
    "heads_view_without_transpose": ("the heads are split with view alone, without transpose: "
                                     "positions and features get mixed, or attention runs "
                                     "across heads instead of positions",
                                     "splitting into heads regroups the features of each "
                                     "position; the head axis must then come before the position "
                                     "axis, and merging reverses both steps"),
    "heads_merge_without_transpose": ("the heads are merged back with view alone, without "
                                      "transposing (N, H, L, d_k) back to (N, L, H, d_k)",
                                      "merging reverses the split: the position axis goes back "
                                      "before the head axis before the features are joined"),
    "no_output_projection": ("w_o is not used: the merged heads are returned without the "
                             "output projection",
                             "the concatenated heads go through the output projection w_o before "
                             "they are returned"),
    "unused_projection": ("a projection layer is not used",
                          "each of query, key and value has a projection of its own, and each is "
                          "used once"),
    "key_value_swapped": ("key and value are swapped: the scores use the value tensor and the "
                          "output mixes the key tensor",
                          "the keys decide where to look (they meet the queries in the scores); "
                          "the values are what is mixed"),
    "scale_d_v": ("the scores are divided by sqrt(d_v), the size of the values (v.size(-1)); "
                  "the scale is sqrt(d_k), the size of the queries and keys",
                  "the scale belongs to the dot product of queries and keys, so it uses their "
                  "size, d_k"),
    "mask_needs_head_axis": ("a 3-D mask (N, L_q, L_k) or (N, 1, L_k) does not broadcast over "
                             "the heads",
                             "the scores have a head axis the check's masks do not have; a mask "
                             "must broadcast over the heads"),
    "mask_2d_head_axis": ("a 2-D mask (L_q, L_k) fails where the same mask as (1, L_q, L_k) "
                          "works: the 2-D case does not line up with the scores' last two axes "
                          "(often it got the head axis a 3-D mask needs)",
                          "a mask broadcasts from its last axis backwards: a 2-D mask already "
                          "fits every sentence and head, only a mask with a batch axis lacks "
                          "the head axis"),
    "attn_weights_not_stored": ("forward does not keep its attention weights in "
                                "self.attn_weights",
                                "keep each call's (N, H, L_q, L_k) weights on the module, as "
                                "the contract names them, detached, for plotting"),
    "attn_weights_wrong": ("self.attn_weights is not the last call's (N, H, L_q, L_k) weights",
                           "keep the weights of every head, as the softmax returned them, "
                           "after each call"),
    # found by the localising probes (labkit/localize.py)
    "attention_values_wrong": ("the output is not the attention weights applied to v",
                               "the output is the weighted mix of the values, with the softmax "
                               "weights of each query"),
    "attention_rows_not_normalised": ("each query's weights over the keys do not sum to 1",
                                      "each query's weights over the keys are a probability "
                                      "distribution"),
    "attention_weights_not_softmax": ("the weights are not a softmax of the scaled scores",
                                      "the weights are the softmax of the scaled query-key "
                                      "scores, over the keys"),
    "mask_fill_weak": ("masked keys still get some weight: the fill value is not negative "
                       "enough (or it is added instead of filled)",
                       "a hidden key must get no weight: its score has to be so low that the "
                       "softmax gives it nothing"),
    "mask_other": ("with a mask, the weights over the unmasked keys are not a softmax over "
                   "those keys alone",
                   "with a mask, the weights over the visible keys are a softmax over those keys "
                   "alone"),
    "heads_split_wrong": ("the heads split or merge mixes positions and features",
                          "a head holds a contiguous slice of each position's features; positions "
                          "must never be mixed into the features"),
    "projection_inputs_wrong": ("a projection is applied to the wrong input tensor",
                                "the query projection reads the query input, the key projection "
                                "the key input, the value projection the value input"),
    "mha_output_changed": ("the module changes w_o's output before returning it",
                           "the block returns the output projection's result as it is"),
    "ffn_input_changed": ("linear1 does not receive the block's input x",
                          "the first linear layer reads the block's input itself"),
    "ffn_activation_wrong": ("the activation between linear1 and linear2 is not ReLU",
                             "the paper's position-wise feed-forward network puts a ReLU between "
                             "its two linear layers"),
    "ffn_output_changed": ("linear2's output is changed before it is returned",
                           "the second linear layer's output is the block's output, unchanged"),
    "ffn_hidden_width": ("the hidden layer does not have d_ff units",
                         "the hidden layer of the feed-forward network is d_ff wide (2048 in the "
                         "paper), the input and output d_model"),
    "sublayer_calls": ("a sublayer is called more or fewer times than once per forward pass",
                       "each sublayer runs once per forward pass, and its output feeds one "
                       "residual add"),
    "sublayer_input_wrong": ("a sublayer receives the wrong input",
                             "follow the stream: each sublayer reads the output of the step "
                             "before it"),
    "sublayer_output_dropped": ("a sublayer's output never reaches the residual stream",
                                "a sublayer's result must reach the residual stream; a result "
                                "never kept changes nothing"),
    "pe_not_added": ("the positional encoding is not added to the embeddings",
                     "the positional encoding is added to the scaled embeddings before the first "
                     "layer"),
    "embedding_scale_wrong": ("the embeddings are scaled by the wrong factor",
                              "the paper multiplies the embeddings by the square root of d_model"),
    "embedding_stage_wrong": ("the first layer does not receive embedding x sqrt(d_model) + PE",
                              "the first layer reads embeddings scaled by the square root of "
                              "d_model with the positional encoding added"),
    "layers_not_chained": ("a layer does not receive the previous layer's output",
                           "the layers form a chain: each one reads the output of the one before "
                           "it"),
    "memory_wrong": ("the decoder does not receive the encoder's output as memory",
                     "the decoder's memory is the encoder's output for the same source, computed "
                     "with its mask"),
    "generator_input_wrong": ("the generator does not receive the decoder's output",
                              "the generator reads the decoder's final hidden states"),
    "output_changed": ("the generator's output is changed before it is returned",
                       "the model returns the generator's logits as they are"),
    "layer_mask_differs": ("a layer is given a mask that hides other positions than it should",
                           "encoder layers get the source padding mask; decoder self-attention "
                           "gets padding or look-ahead; cross-attention gets the source padding"),
    "ffn_no_bias": ("the feed-forward's Linears have no bias; the paper's FFN(x) = "
                    "max(0, x W1 + b1) W2 + b2 has both",
                    "the paper's FFN has a bias in each of its two linear layers"),
    "layers_shared": ("the stack repeats one layer object: every layer shares the same weights",
                      "a stack of N layers holds N independent sets of weights"),
    "pe_same_rows": ("every position gets the same row of the table: the position is not used",
                     "each row of the table belongs to one position: the angle grows with the "
                     "position, one frequency per column pair"),
    "attention_log_weights": ("the attention weights are log-probabilities (log_softmax), not "
                              "probabilities",
                              "the weights are probabilities (the softmax itself), not their "
                              "logarithms"),
    "mask_transposed": ("the mask is transposed: it hides queries where it should hide keys "
                        "(or the reverse)",
                        "a mask is laid out like the scores: one row per query, one column per "
                        "key"),
    "ffn_dropout_position": ("in train mode, dropout acts in the wrong place in the "
                             "feed-forward: the layer around it already drops the sublayer's "
                             "output",
                             "in the paper's feed-forward block, dropout acts on the hidden layer "
                             "only (or nowhere)"),
    "mask_wrong_batch": ("the mask reaches the wrong batch element (or head)",
                         "every head of a sequence uses that sequence's mask; if heads are folded "
                         "into the batch axis, each sequence's mask must follow its heads"),
    "layernorm_missing": ("a LayerNorm is missing after a sublayer's residual add",
                          "Post-LN normalises after every residual add"),
    "residual_doubled": ("a sublayer's output is added to the stream twice",
                         "each sublayer adds its input back once"),
    "residual_wrong": ("the residual add and LayerNorm around a sublayer are not the paper's",
                       "the residual adds the sublayer's own input to its output (Post-LN "
                       "normalises that sum)"),
    "delegated": ("your code hands this exercise to the reference it rebuilds",
                  "the grade gives no credit for the reference's work, under any name: build "
                  "this part from the operations the lesson taught (other exercises' blocks may "
                  "still be used as parts)"),
    "checker_failed": ("the check itself failed on your code; this says nothing about whether "
                       "your code is right",
                       "compare your output with the tx_helpers version by hand, and tell the "
                       "course authors which layout broke the check"),
    "mismatch": ("the numbers differ from the reference and match none of the known mistakes",
                 "print intermediate shapes and values and compare them with tx_helpers, one "
                 "stage at a time"),
}


from .mistakes_loss_decoding import LOSS_AND_DECODING  # noqa: E402 - kept in its own file

MISTAKES.update(LOSS_AND_DECODING)

from .mistakes_blocks import BLOCKS  # noqa: E402 - kept in its own file

MISTAKES.update(BLOCKS)

from .mistakes_beam import BEAM  # noqa: E402 - kept in its own file

MISTAKES.update(BEAM)
