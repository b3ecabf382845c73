"""The fine-tuning losses against hand computations (numbers written out with math.log/exp)."""

import math

import pytest
import torch
import torch.nn.functional as F

from dprflow.finetuning.losses import (
    contrastive_loss,
    distill_kl,
    distillation_loss,
    group_scores,
    listwise_ce,
)

# Two queries, groups of two passages (positive first, then one hard negative), H = 2.
Q = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
P = torch.tensor(
    [
        [2.0, 0.0],  # p0: positive of q0
        [1.0, 1.0],  # p1: hard negative of q0
        [0.0, 1.0],  # p2: positive of q1
        [1.0, 0.0],  # p3: hard negative of q1
    ]
)
# Q @ P.T = [[2, 1, 0, 1],
#            [0, 2, 2, 0]]
E = math.e
L0 = math.log(E**2 + E + 1 + E) - 2  # -log softmax(q0)[p0] over all four passages
L1 = math.log(1 + E**2 + E**2 + 1) - 2  # -log softmax(q1)[p2]


def test_contrastive_loss_matches_hand_computation():
    loss = contrastive_loss(Q, P, group_size=2)
    assert loss.item() == pytest.approx((L0 + L1) / 2, rel=1e-6)


def test_contrastive_loss_temperature_divides_scores():
    loss = contrastive_loss(Q, P, group_size=2, temperature=0.5)  # scores doubled
    expected = ((math.log(E**4 + 2 * E**2 + 1) - 4) + (math.log(2 * E**4 + 2) - 4)) / 2
    assert loss.item() == pytest.approx(expected, rel=1e-6)


def test_contrastive_loss_counts_other_queries_hard_negatives():
    # Query 0 alone still sees all B * G = 4 passages, including q1's hard negative p3.
    assert contrastive_loss(Q[:1], P, group_size=2).item() == pytest.approx(L0, rel=1e-6)
    changed = P.clone()
    changed[3] = torch.tensor([3.0, 0.0])  # q0 . p3 goes from 1 to 3
    expected = math.log(E**2 + E + 1 + E**3) - 2
    assert contrastive_loss(Q[:1], changed, group_size=2).item() == pytest.approx(expected, rel=1e-6)


def test_contrastive_loss_rank_offset_picks_the_right_positive():
    assert contrastive_loss(Q[1:], P, group_size=2, rank_offset=1).item() == pytest.approx(L1, rel=1e-6)


def test_contrastive_loss_group_size_one_is_in_batch_negatives():
    positives = P[::2]  # p0, p2
    loss = contrastive_loss(Q, positives, group_size=1)
    # scores [[2, 0], [0, 2]]: both queries -log(e^2 / (e^2 + 1))
    assert loss.item() == pytest.approx(math.log(E**2 + 1) - 2, rel=1e-6)
    assert loss.item() == pytest.approx(F.cross_entropy(Q @ positives.T, torch.arange(2)).item(), rel=1e-6)


def test_contrastive_loss_rejects_bad_layout():
    with pytest.raises(ValueError, match="multiple of group_size"):
        contrastive_loss(Q, P[:3], group_size=2)
    with pytest.raises(ValueError, match="rank_offset"):
        contrastive_loss(Q, P, group_size=2, rank_offset=1)


def test_group_scores_takes_each_querys_own_group():
    scores = Q @ P.T
    assert group_scores(scores, 2).tolist() == [[2.0, 1.0], [2.0, 0.0]]
    assert group_scores(scores[1:], 2, rank_offset=1).tolist() == [[2.0, 0.0]]


def test_listwise_ce_matches_hand_computation():
    scores = torch.tensor([[3.0, 1.0, 0.0], [0.0, 2.0, 0.0]])
    expected = ((math.log(E**3 + E + 1) - 3) + math.log(1 + E**2 + 1)) / 2
    assert listwise_ce(scores).item() == pytest.approx(expected, rel=1e-6)


# Row 0: P_teacher = (0.8, 0.2), P_student = (0.5, 0.5); row 1: both (0.5, 0.5), KL 0.
# Log-probabilities are valid logits: softmax(log p) = p.
TEACHER = torch.log(torch.tensor([[0.8, 0.2], [0.5, 0.5]]))
STUDENT = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))


def test_distill_kl_teacher_student_is_cdmae_eq_11():
    kl = distill_kl(STUDENT, TEACHER, direction="teacher_student")
    expected = (0.8 * math.log(0.8 / 0.5) + 0.2 * math.log(0.2 / 0.5)) / 2  # batchmean over 2 queries
    assert kl.item() == pytest.approx(expected, rel=1e-6)
    reference = F.kl_div(
        F.log_softmax(STUDENT, -1), F.log_softmax(TEACHER, -1), log_target=True, reduction="batchmean"
    )
    assert kl.item() == pytest.approx(reference.item(), rel=1e-6)


def test_distill_kl_student_teacher_is_cocondenser_eq_16():
    kl = distill_kl(STUDENT, TEACHER, direction="student_teacher")
    expected = (0.5 * math.log(0.5 / 0.8) + 0.5 * math.log(0.5 / 0.2)) / 2
    assert kl.item() == pytest.approx(expected, rel=1e-6)
    assert kl.item() != pytest.approx(distill_kl(STUDENT, TEACHER).item(), rel=1e-3)  # the directions differ


def test_distill_kl_temperature():
    # softmax(log p / 2) is proportional to sqrt(p): teacher (0.8, 0.2) -> (2/3, 1/3).
    kl = distill_kl(STUDENT[:1], TEACHER[:1], temperature=2.0)
    expected = 2 / 3 * math.log((2 / 3) / 0.5) + 1 / 3 * math.log((1 / 3) / 0.5)
    assert kl.item() == pytest.approx(expected, rel=1e-6)


def test_distill_kl_teacher_gets_no_gradient():
    student = STUDENT.clone().requires_grad_(True)
    teacher = TEACHER.clone().requires_grad_(True)
    distill_kl(student, teacher).backward()
    assert teacher.grad is None
    assert student.grad is not None and student.grad[0].abs().sum() > 0
    # d KL(t || s) / d s = (P_s - P_t) / B
    assert torch.allclose(student.grad[0], torch.tensor([0.5 - 0.8, 0.5 - 0.2]) / 2, atol=1e-6)


def test_distill_kl_unknown_direction_lists_allowed():
    with pytest.raises(ValueError, match="teacher_student, student_teacher"):
        distill_kl(STUDENT, TEACHER, direction="forward")


def test_distillation_loss_is_kl_plus_alpha_contrastive():
    teacher = torch.tensor([[0.0, 0.0], [1.0, 0.0]])
    out = distillation_loss(Q, P, teacher, group_size=2, alpha=0.2)
    kl = distill_kl(torch.tensor([[2.0, 1.0], [2.0, 0.0]]), teacher)  # each query's own group of Q @ P.T
    assert out.contrastive.item() == pytest.approx((L0 + L1) / 2, rel=1e-6)
    assert out.kl.item() == pytest.approx(kl.item(), rel=1e-6)
    assert out.loss.item() == pytest.approx(kl.item() + 0.2 * (L0 + L1) / 2, rel=1e-6)
    with pytest.raises(ValueError, match="teacher scores"):
        distillation_loss(Q, P, teacher[:, :1], group_size=2)


def test_coCondenser_distillation_student_over_the_batch_teacher_zero_outside_the_group():
    """coCondenser 5.1 (eq. 15): S over all M*N passages, T zero outside the query's group;
    KL(T || S) as Tevatron's DistilTrainer computes it (kl_div of log S against the zero-padded T)."""
    from dprflow.finetuning.losses import distill_kl_batch, distillation_loss

    g = torch.Generator().manual_seed(7)
    B, G, H = 3, 4, 5
    q, p = (
        torch.randn(B, H, generator=g, dtype=torch.float64),
        torch.randn(B * G, H, generator=g, dtype=torch.float64),
    )
    teacher = torch.randn(B, G, generator=g, dtype=torch.float64)
    scores = q @ p.T
    t_full = torch.zeros(B, B * G, dtype=torch.float64)
    for i in range(B):
        t_full[i, i * G : (i + 1) * G] = teacher[i].softmax(-1)
    reference = F.kl_div(scores.log_softmax(-1), t_full, reduction="batchmean")
    assert distill_kl_batch(scores, teacher, G).item() == pytest.approx(reference.item(), rel=1e-12)
    out = distillation_loss(q, p, teacher, group_size=G, student_over="batch")
    assert out.kl.item() == pytest.approx(reference.item(), rel=1e-12)
    group = distillation_loss(q, p, teacher, group_size=G)  # CDMAE eq. 11: the group only
    assert group.kl.item() < out.kl.item()  # the in-batch passages take mass from S
    # the local half of a gathered batch (rank 1 of 2: its queries are 1..2 of 3) gives its rows
    local = distill_kl_batch(scores[1:], teacher[1:], G, rank_offset=1)
    rows = F.kl_div(scores[1:].log_softmax(-1), t_full[1:], reduction="batchmean")
    assert local.item() == pytest.approx(rows.item(), rel=1e-12)
    with pytest.raises(ValueError, match="infinite"):
        distillation_loss(q, p, teacher, group_size=G, student_over="batch", direction="student_teacher")
