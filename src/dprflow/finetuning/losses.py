"""Fine-tuning losses of the dense retriever and its cross-encoder teacher.

Pure functions on tensors: they take embeddings or scores and return a scalar loss (averaged
over the local queries), so the training stages, a gradient cache and the distributed path all
share them. The layout of passages is the one of DPR / Tevatron: every query ``i`` brings a
*group* of ``G`` passages, its positive first and then ``G - 1`` hard negatives, and the groups of
the batch are concatenated, so passage ``p[i * G]`` is the positive of query ``i``::

    q: [B, H]          query embeddings
    p: [B * G, H]      p[i*G] = positive of query i, p[i*G+1 : (i+1)*G] = its hard negatives

Papers (in ``shared/papers``): coCondenser (Gao & Callan, 2022) eq. 13-16; CDMAE (challenging
decoder) eq. 10-11; query-as-context §3.2 (InfoNCE with tau = 1).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

KL_DIRECTIONS = ("teacher_student", "student_teacher")


def _check_groups(q: torch.Tensor, p: torch.Tensor, group_size: int, rank_offset: int) -> None:
    if q.dim() != 2 or p.dim() != 2 or q.size(1) != p.size(1):
        raise ValueError(
            f"expected q [B, H] and p [N, H] with the same H, got {tuple(q.shape)} and {tuple(p.shape)}"
        )
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if p.size(0) % group_size:
        raise ValueError(f"p has {p.size(0)} rows, not a multiple of group_size={group_size}")
    if rank_offset < 0 or (rank_offset + q.size(0)) * group_size > p.size(0):
        raise ValueError(
            f"queries {rank_offset}..{rank_offset + q.size(0) - 1} need {(rank_offset + q.size(0)) * group_size} "
            f"passages (group_size={group_size}) but p has {p.size(0)}; check rank_offset and group_size"
        )


def positive_index(num_queries: int, group_size: int, rank_offset: int = 0, device=None) -> torch.Tensor:
    """Column of each local query's positive in ``q @ p.T``: ``(rank_offset + i) * group_size``."""
    return (torch.arange(num_queries, device=device) + rank_offset) * group_size


def group_scores(scores: torch.Tensor, group_size: int, rank_offset: int = 0) -> torch.Tensor:
    """Scores of each query against its own group only.

    Args:
        scores: ``[B, N]`` scores of the local queries against all passages (``q @ p.T``).
        group_size: ``G``, passages per query.
        rank_offset: index of the first local query in the (gathered) passage list, in queries.

    Returns:
        ``[B, G]``; column 0 is the positive, as in :func:`listwise_ce` and :func:`distill_kl`.
    """
    start = positive_index(scores.size(0), group_size, rank_offset, device=scores.device)
    index = start[:, None] + torch.arange(group_size, device=scores.device)[None, :]  # [B, G]
    return scores.gather(1, index)


def contrastive_loss(
    q: torch.Tensor,
    p: torch.Tensor,
    *,
    group_size: int,
    temperature: float = 1.0,
    rank_offset: int = 0,
) -> torch.Tensor:
    """Contrastive loss with hard and in-batch negatives (DPR / Tevatron).

    For query ``q_i`` the positive is ``p[(rank_offset + i) * G]``; every other passage of the
    batch is a negative: its own ``G - 1`` hard negatives and the positives and hard negatives of
    all other queries (in-batch negatives). The loss is the softmax cross-entropy over all
    ``N = B * G`` passages (coCondenser eq. 14, CDMAE eq. 10, query-as-context §3.2 InfoNCE)::

        s(q, p) = <q, p> / temperature                                       (coCondenser eq. 13)
        L = -1/B sum_i log( exp(s(q_i, p_i+)) / sum_{j=1..N} exp(s(q_i, p_j)) )

    So each query sees ``B * G - 1`` negatives, ``G - 1`` of them hard (CDMAE §4.3). With
    ``group_size=1`` it reduces to in-batch negatives only.

    Assumes: the passages are laid out in groups of ``G``, positive first (see the module
    docstring). The papers use the dot product and ``temperature = 1``; normalise the
    embeddings beforehand for cosine similarity (then a temperature around 0.05 is usual).

    Distributed use: pass the local queries and the passages gathered from all ranks
    (:func:`dprflow.training.distributed.gather_with_grad`) with ``rank_offset = rank * B_local``, the
    index of the first local query in the gathered batch. The mean of the per-rank losses is
    then the loss of the full batch.

    Args:
        q: ``[B, H]`` query embeddings.
        p: ``[N, H]`` passage embeddings, ``N`` a multiple of ``group_size`` and at least
            ``(rank_offset + B) * group_size``.
        group_size: ``G``, passages per query (1 positive + ``G - 1`` hard negatives).
        temperature: the scores are divided by it.
        rank_offset: index (in queries) of ``q[0]`` in the batch that ``p`` holds.

    Returns:
        Scalar, the mean over the local queries.

    Example::

        q = torch.randn(2, 8)          # 2 queries
        p = torch.randn(2 * 4, 8)      # each with 1 positive + 3 hard negatives
        loss = contrastive_loss(q, p, group_size=4)
    """
    _check_groups(q, p, group_size, rank_offset)
    scores = q @ p.T / temperature  # [B, N]
    target = positive_index(q.size(0), group_size, rank_offset, device=q.device)  # [B]
    return F.cross_entropy(scores, target)


def listwise_ce(scores: torch.Tensor) -> torch.Tensor:
    """List-wise cross-entropy of a reranker (cross-encoder) over each query's own group.

    The cross-encoder scores each (query, passage) pair of a group; the loss is the softmax
    cross-entropy with the positive in column 0. Unlike :func:`contrastive_loss` there are no
    in-batch negatives (CDMAE §3.4, stage 3: "in-batch negatives are not involved")::

        L = -1/B sum_i log( exp(s_i0) / sum_{g=0..G-1} exp(s_ig) )

    Args:
        scores: ``[B, G]`` scores, column 0 the positive, then the hard negatives.

    Returns:
        Scalar, the mean over the queries.

    Example::

        scores = cross_encoder(**pairs).view(batch_size, group_size)
        loss = listwise_ce(scores)
    """
    if scores.dim() != 2:
        raise ValueError(f"expected scores [B, G], got shape {tuple(scores.shape)}")
    target = torch.zeros(scores.size(0), dtype=torch.long, device=scores.device)
    return F.cross_entropy(scores, target)


def distill_kl(
    student: torch.Tensor,
    teacher: torch.Tensor,
    direction: str = "teacher_student",
    temperature: float = 1.0,
) -> torch.Tensor:
    """KL divergence between the teacher's and the student's relevance distributions over each group.

    Both score matrices are turned into distributions over the group of each query,
    ``P(d | q) = softmax_d(s(q, d) / temperature)``, and compared with a KL divergence averaged
    over queries (``batchmean``). The teacher (a cross-encoder reranker) is detached: it gets no
    gradient.

    - ``"teacher_student"``: ``KL(P_teacher || P_student) = sum_d P_t (log P_t - log P_s)``, the
      student matches the reranker's distribution (CDMAE eq. 11, ``KL(P_ce || P_de)``; also
      SimLM, which CDMAE follows). This is the forward KL of Hinton-style distillation: up to a
      constant, the cross-entropy of the student against the soft labels.
    - ``"student_teacher"``: ``KL(P_student || P_teacher) = sum_d P_s (log P_s - log P_t)``,
      the argument order written in coCondenser §5.1 eq. 16, ``D_KL(S || T)``, both restricted
      to the group. (With coCondenser's own ``S`` over all in-batch passages and ``T`` zero
      outside the group, this order is infinite: see :func:`distill_kl_batch`.)

    No ``temperature ** 2`` factor is applied (the papers use temperature 1).

    Args:
        student: ``[B, G]`` bi-encoder scores of each query against its group.
        teacher: ``[B, G]`` cross-encoder scores of the same pairs.
        direction: ``"teacher_student"`` (default) or ``"student_teacher"``.
        temperature: both score matrices are divided by it.

    Returns:
        Scalar, summed over the group and averaged over the queries.

    Example::

        student = group_scores(q @ p.T, group_size=8)   # [B, 8]
        teacher = reranker_scores.view(-1, 8)           # [B, 8]
        loss = distill_kl(student, teacher)
    """
    if direction not in KL_DIRECTIONS:
        raise ValueError(f"unknown KL direction {direction!r}; allowed: {', '.join(KL_DIRECTIONS)}")
    if student.shape != teacher.shape or student.dim() != 2:
        raise ValueError(
            f"expected student and teacher scores of the same shape [B, G], got {tuple(student.shape)} "
            f"and {tuple(teacher.shape)}"
        )
    log_p_student = F.log_softmax(student / temperature, dim=-1)
    log_p_teacher = F.log_softmax(teacher.detach().to(student.dtype) / temperature, dim=-1)
    if direction == "teacher_student":
        kl = log_p_teacher.exp() * (log_p_teacher - log_p_student)
    else:
        kl = log_p_student.exp() * (log_p_student - log_p_teacher)
    return kl.sum() / student.size(0)


def distill_kl_batch(
    scores: torch.Tensor,
    teacher: torch.Tensor,
    group_size: int,
    rank_offset: int = 0,
    temperature: float = 1.0,
) -> torch.Tensor:
    """coCondenser §5.1's distillation: the student distribution over *every* passage of the
    batch, the teacher's zero outside the query's own group (eq. 15)::

        T_l(p_ij) = softmax_j(g(q_l, p_ij))   if i = l, else 0                     (eq. 15)
        S_l(p_ij) = softmax_ij(s(q_l, p_ij))  over all M * N passages of the batch
        L_kd      = 1/M sum_l KL(T_l || S_l) = 1/M sum_l sum_j T_lj (log T_lj - log S_l(p_lj))

    Eq. 16 writes ``D_KL(S || T)``; with ``T`` zero where ``S`` is positive that is infinite, so
    the argument order there is a notational slip: this is ``KL(T || S)``, as the authors' own
    distillation code does (Tevatron ``DistilTrainer.compute_loss``: ``kl_div(log_softmax(student
    row), teacher with zeros outside the group, "batchmean")``). The in-batch passages only enter
    the student's normaliser, so the student is also pushed to score them low.

    Args:
        scores: ``[B, N]`` bi-encoder scores of the local queries against all passages.
        teacher: ``[B, G]`` cross-encoder scores of each query's group (column 0 the positive).
        group_size: ``G``.
        rank_offset: index (in queries) of the first local query in the passage list.
        temperature: both score matrices are divided by it.
    """
    if teacher.shape != (scores.size(0), group_size):
        raise ValueError(
            f"expected teacher scores [B={scores.size(0)}, G={group_size}], got {tuple(teacher.shape)}"
        )
    log_s = group_scores(F.log_softmax(scores / temperature, dim=-1), group_size, rank_offset)  # [B, G]
    log_t = F.log_softmax(teacher.detach().to(scores.dtype) / temperature, dim=-1)  # [B, G]
    return (log_t.exp() * (log_t - log_s)).sum() / scores.size(0)


STUDENT_SUPPORTS = ("group", "batch")


class DistillationLoss(NamedTuple):
    """The reranker-distillation objective and its two parts (for logging)."""

    loss: torch.Tensor  # kl + alpha * contrastive
    kl: torch.Tensor
    contrastive: torch.Tensor


def distillation_loss(
    q: torch.Tensor,
    p: torch.Tensor,
    teacher: torch.Tensor,
    *,
    group_size: int,
    alpha: float = 0.2,
    temperature: float = 1.0,
    direction: str = "teacher_student",
    rank_offset: int = 0,
    student_over: str = "group",
) -> DistillationLoss:
    """Reranker distillation with the contrastive loss kept: ``L = L_kl + alpha * L_cont`` (CDMAE §3.4).

    The student scores ``s(q, p) = <q, p> / temperature`` are computed once against all passages:
    the contrastive part (eq. 10, :func:`contrastive_loss`) uses all of them (hard and in-batch
    negatives); the KL part (eq. 11, :func:`distill_kl`) uses only each query's own group, since
    the teacher scores only those pairs. As in SimLM (which CDMAE follows), the temperature
    scales the student scores and the teacher's logits are used as they are. With
    ``student_over="batch"`` the KL part is coCondenser §5.1's instead (:func:`distill_kl_batch`:
    the student's distribution over all passages of the batch, ``KL(T || S)``).

    Assumes: the layout of :func:`contrastive_loss`, and teacher scores in the same group order
    (column 0 the positive).

    Args:
        q: ``[B, H]`` query embeddings (local).
        p: ``[N, H]`` passage embeddings (local, or gathered from all ranks).
        teacher: ``[B, G]`` cross-encoder scores of each local query against its group.
        group_size: ``G``.
        alpha: weight of the contrastive part; 0.2 in CDMAE and SimLM.
        temperature: the bi-encoder scores are divided by it.
        direction: of the KL; see :func:`distill_kl`.
        rank_offset: index (in queries) of ``q[0]`` in the batch that ``p`` holds.
        student_over: ``"group"`` (CDMAE eq. 11) or ``"batch"`` (coCondenser §5.1; needs
            ``direction="teacher_student"``).

    Returns:
        ``DistillationLoss(loss, kl, contrastive)``; back-propagate ``.loss``.

    Example::

        q, p = biencoder(query_inputs, passage_inputs)     # [B, H], [B * G, H]
        out = distillation_loss(q, p, teacher_scores, group_size=G)
        out.loss.backward()
    """
    _check_groups(q, p, group_size, rank_offset)
    if teacher.shape != (q.size(0), group_size):
        raise ValueError(
            f"expected teacher scores [B={q.size(0)}, G={group_size}], got {tuple(teacher.shape)}"
        )
    if student_over not in STUDENT_SUPPORTS:
        raise ValueError(f"unknown student_over {student_over!r}; allowed: {', '.join(STUDENT_SUPPORTS)}")
    if student_over == "batch" and direction != "teacher_student":
        raise ValueError(
            "student_over='batch' needs direction='teacher_student': KL(S || T) is infinite when T is "
            "zero outside the query's group (coCondenser eq. 15-16)"
        )
    scores = q @ p.T / temperature  # [B, N]
    target = positive_index(q.size(0), group_size, rank_offset, device=q.device)
    contrastive = F.cross_entropy(scores, target)
    if student_over == "batch":
        kl = distill_kl_batch(scores, teacher, group_size, rank_offset)
    else:
        kl = distill_kl(group_scores(scores, group_size, rank_offset), teacher, direction=direction)
    return DistillationLoss(kl + alpha * contrastive, kl, contrastive)
