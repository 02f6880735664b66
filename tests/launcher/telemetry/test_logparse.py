"""Metrics from rank output: HF Trainer log dicts and tqdm progress lines."""

from __future__ import annotations

import math

import pytest

from xl.launcher.telemetry.logparse import parse_line


def test_printer_callback_dict() -> None:
    line = "{'loss': 0.6931, 'grad_norm': 1.25, 'learning_rate': 5e-05, 'epoch': 0.5}"
    assert parse_line(line) == {"loss": 0.6931, "grad_norm": 1.25, "lr": 5e-05, "epoch": 0.5}


def test_progress_callback_dict_with_formatted_strings() -> None:
    # ProgressCallback writes floats through "%.4g" as strings, inside tqdm's output.
    line = (
        "\r 20%|██        | 2/10 [00:01<00:04]{'loss': '4.567', 'grad_norm': '0.8459', "
        "'learning_rate': '0.0001', 'epoch': '0.2'}"
    )
    assert parse_line(line) == {"loss": 4.567, "grad_norm": 0.8459, "lr": 0.0001, "epoch": 0.2}


def test_nan_and_inf_loss_are_kept_as_nonfinite() -> None:
    out = parse_line("{'loss': nan, 'grad_norm': inf, 'learning_rate': 1e-3, 'epoch': 1.0}")
    assert out is not None
    assert out["loss"] is None and out["grad_norm"] is None
    assert out["nonfinite"] == {"loss": "nan", "grad_norm": "inf"}
    assert out["lr"] == pytest.approx(1e-3)


def test_trainer_summary_is_marked() -> None:
    line = (
        "{'train_runtime': 3.2, 'train_samples_per_second': 10.0, 'train_loss': 4.5, 'epoch': 1.0}"
    )
    out = parse_line(line)
    assert out is not None and out["summary"] is True and out["loss"] == 4.5


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (
            " 40%|████      | 4/10 [00:01<00:02,  2.95it/s]",
            {"step": 4, "total_steps": 10, "steps_per_s": 2.95},
        ),
        (
            "100%|██████████| 10/10 [00:03<00:00,  3.01it/s]",
            {"step": 10, "total_steps": 10, "steps_per_s": 3.01},
        ),
        ("  0%|          | 0/10 [00:00<?, ?it/s]", {"step": 0, "total_steps": 10}),
        (
            "  5%|▌         | 5/100 [00:10<03:10,  2.00s/it]",
            {"step": 5, "total_steps": 100, "steps_per_s": 0.5},
        ),
        (
            # an epoch bar restarts each epoch: the step counts on (epoch 1 of 100-step epochs)
            "Epoch 1:  50%|█████     | 50/100 [00:05<00:05, 9.80it/s, loss=0.3]",
            {"step": 150, "epoch": 1, "loss": 0.3, "steps_per_s": 9.8},
        ),
    ],
)
def test_tqdm_lines(line: str, expected: dict) -> None:
    assert parse_line(line) == expected


def test_carriage_returns_keep_the_last_update() -> None:
    line = (
        " 10%|█         | 1/10 [00:00<00:05,  1.50it/s]\r 20%|██        | 2/10 [00:01<00:04,  "
        "1.90it/s]"
    )
    assert parse_line(line) == {"step": 2, "total_steps": 10, "steps_per_s": 1.9}


@pytest.mark.parametrize(
    "line",
    [
        "",
        "epoch 1 loss went down",
        "{'name': 'bert', 'layers': [1, 2]}",
        "{'loss': __import__('os').system('true')}",
        "downloading 3/4 files",
        "ratio 1/2 [x]",
    ],
)
def test_ordinary_output_is_not_a_metric(line: str) -> None:
    assert parse_line(line) is None


def test_values_are_finite_numbers_or_null() -> None:
    out = parse_line("{'loss': 1e400, 'epoch': 2}")
    assert out is not None and out["loss"] is None and out["nonfinite"] == {"loss": "inf"}
    assert not any(isinstance(v, float) and not math.isfinite(v) for v in out.values())


@pytest.mark.parametrize(
    "line",
    [
        # transformers' run_clm.py prints its generation config
        "{'eos_token_id': 0, 'bos_token_id': 0}",
        "{'lr': 0.0003, 'batch_size': 64, 'epochs': 10}",  # a plain script's hyperparameters
        "config: {'n_layer': 12, 'n_head': 12, 'dropout': 0.0}",
        "{'loss': 'mse', 'optimizer': 'adam'}",  # a loss named, not a value
    ],
)
def test_a_printed_config_dict_is_not_a_training_log(line: str) -> None:
    assert parse_line(line) is None


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("{'eval_loss': 0.41, 'eval_runtime': 1.2, 'epoch': 1.0}", "eval_loss"),
        ("{'epoch': 2, 'grad_norm': 0.3}", "epoch"),
        ("{'loss_mlm': 2.5, 'step': 10}", "loss_mlm"),
        ("{'val_loss': 1.5}", "val_loss"),
    ],
)
def test_a_dict_with_a_loss_or_an_epoch_reads_as_a_training_log(line: str, key: str) -> None:
    out = parse_line(line)
    assert out is not None and key in out
