"""xl.gpu.models: the models a set of GPUs holds, and the one sentence for a mix (what the
doctor's `gpus` check and the app's GPU picker both say)."""

from __future__ import annotations

from gpus import idle_gpu

from xl.gpu.inventory import GPU
from xl.gpu.models import mixed_models, model_counts, model_names, models_text


def gpu(index: int, name: str) -> GPU:
    return idle_gpu(index, name)


def test_counts_keep_the_order_models_first_appear_in() -> None:
    gpus = [gpu(0, "T4"), gpu(1, "A100"), gpu(2, "T4")]
    assert list(model_counts(gpus).items()) == [("T4", 2), ("A100", 1)]
    assert models_text(model_counts(gpus)) == "2x T4, 1x A100"
    assert model_names(gpus) == ["A100", "T4"]


def test_alike_gpus_say_nothing() -> None:
    assert mixed_models([gpu(0, "A100"), gpu(1, "A100")]) is None
    assert mixed_models([]) is None


def test_mixed_gpus_are_said_in_one_sentence() -> None:
    said = mixed_models(gpu(i, name) for i, name in enumerate(["A100", "A100", "Tesla T4"]))
    assert (
        said == "mixed models: 2x A100, 1x Tesla T4; DDP runs every rank at the slowest GPU's pace"
    )
