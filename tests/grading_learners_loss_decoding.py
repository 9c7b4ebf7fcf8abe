"""Learner-style label-smoothing losses and greedy decoders, correct and with one mistake each.

Written the way a learner would (not with the checks' own variant code); used by
tests/test_grading_loss_decoding.py and tests/test_mistake_catalogue.py.
"""
import torch
import torch.nn.functional as F

import tx_helpers as tx


def make_smoothed_loss(spread="V", pad="ignore", reduce="mean", kl=False, stable=True,
                       eps_fixed=None, detach=False):
    def smoothed_loss(logits, target, eps, pad_idx):
        eps = eps if eps_fixed is None else eps_fixed
        v = logits.size(-1)
        log_p = (torch.log_softmax(logits, dim=-1) if stable
                 else torch.log(torch.softmax(logits, dim=-1)))  # (M, V)
        one_hot = F.one_hot(target, v).float()  # (M, V)
        if spread == "V":
            q = one_hot * (1 - eps) + eps / v
        elif spread == "V-1":
            q = one_hot * (1 - eps) + (1 - one_hot) * eps / (v - 1)
        elif spread == "V-2":  # the Annotated Transformer's LabelSmoothing
            q = torch.full_like(log_p, eps / (v - 2))
            q.scatter_(1, target[:, None], 1 - eps)
            q[:, pad_idx] = 0
        else:  # "no_share": the true class gets 1 - eps
            q = one_hot * (1 - eps) + (1 - one_hot) * eps / v
        terms = -(q * log_p)  # (M, V)
        if kl:
            terms = terms + torch.xlogy(q, q)
        keep = target != pad_idx if pad != "count" else torch.ones_like(target, dtype=torch.bool)
        if reduce == "classes":
            return terms[keep].mean()
        per_position = terms.sum(-1)  # (M,)
        if reduce == "sum":
            return per_position[keep].sum()
        if pad == "mean_all":
            return (per_position * keep).sum() / target.numel()
        loss = per_position[keep].mean()
        return torch.tensor(loss.item()) if detach else loss
    return smoothed_loss


def make_greedy(eval_mode=True, argmax_dim=-1, feed_back=True, pad_after_eos=True,
                exclude=True, extra_steps=0, src_mask=True, stop="all", keep_bos=True,
                lookahead=True):
    @torch.no_grad()
    def greedy(model, src, *, bos_idx, eos_idx, max_len):
        pad_idx, was = model.config.pad_idx, model.training
        if eval_mode:
            model.eval()
        mask = tx.padding_mask(src, pad_idx)  # (N, 1, L_src)
        memory = model.encode(src, mask)  # (N, L_src, d_model)
        ys = torch.full((src.size(0), 1), bos_idx, dtype=torch.long)  # (N, 1)
        out = ys
        done = torch.zeros(src.size(0), dtype=torch.bool)
        for _ in range(max_len + extra_steps):
            prefix = out if feed_back else ys
            tgt_mask = None if lookahead else torch.zeros(1, prefix.size(1), prefix.size(1),
                                                          dtype=torch.bool)
            hidden = model.decode(prefix, memory, mask if src_mask else None, tgt_mask)
            if argmax_dim == -1:
                logits = model.generator(hidden[:, -1])  # (N, V)
                if exclude:
                    logits[:, pad_idx] = -1e9
                    logits[:, bos_idx] = -1e9
                token = logits.argmax(dim=-1)  # (N,)
            else:
                token = model.generator(hidden).argmax(dim=argmax_dim)[:, -1]
            if pad_after_eos:
                token = torch.where(done, torch.full_like(token, pad_idx), token)
            out = torch.cat([out, token.unsqueeze(1)], dim=1)
            done = done | (token == eos_idx)
            if (stop == "all" and done.all()) or (stop == "any" and done.any()):
                break
        model.train(was)
        return out if keep_bos else out[:, 1:]
    return greedy


def greedy_full_length(model, src, *, bos_idx, eos_idx, max_len):
    """Correct, but runs to max_len (pads after EOS): accepted."""
    ys = make_greedy()(model, src, bos_idx=bos_idx, eos_idx=eos_idx, max_len=max_len)
    pad = torch.full((ys.size(0), max_len + 1 - ys.size(1)), model.config.pad_idx)
    return torch.cat([ys, pad], dim=1)


SMOOTHING_MISTAKES = {
    "ls_spread_over_v_minus_1": make_smoothed_loss(spread="V-1"),
    "ls_spread_over_v_minus_2": make_smoothed_loss(spread="V-2"),
    "ls_true_class_missing_share": make_smoothed_loss(spread="no_share"),
    "ls_pad_not_ignored": make_smoothed_loss(pad="count"),
    "ls_mean_over_all_positions": make_smoothed_loss(pad="mean_all"),
    "ls_sum_not_mean": make_smoothed_loss(reduce="sum"),
    "ls_mean_over_classes": make_smoothed_loss(reduce="classes"),
    "ls_kl_divergence": make_smoothed_loss(kl=True),
    "ls_log_of_softmax": make_smoothed_loss(stable=False),
    "ls_eps_hardcoded": make_smoothed_loss(eps_fixed=0.1),
    "ls_eps_ignored": make_smoothed_loss(eps_fixed=0.0),
    "loss_detached": make_smoothed_loss(detach=True),
}

DECODING_MISTAKES = {
    "decode_no_eval": make_greedy(eval_mode=False),
    "decode_argmax_wrong_dim": make_greedy(argmax_dim=1),
    "decode_no_feedback": make_greedy(feed_back=False),
    "decode_no_padding_after_eos": make_greedy(pad_after_eos=False),
    "decode_stops_at_first_eos": make_greedy(stop="any"),
    "decode_pad_bos_not_excluded": make_greedy(exclude=False),
    "decode_max_len_off_by_one": make_greedy(extra_steps=-1),
    "decode_src_mask_missing": make_greedy(src_mask=False),
    "decode_no_bos_column": make_greedy(keep_bos=False),
    "decode_no_lookahead": make_greedy(lookahead=False),
}
