"""StyleProbe: style detection on hand-made strings, by regex, callable or import path."""

from __future__ import annotations

import pickle

import pytest

from distill.callbacks import StyleProbe
from distill.callbacks.style_probe import style_share

TEXTS = [
    "<think>98-74=24, pues 39-24=15</think><answer>39-(98-74)</answer>",
    "<think>luego 3*5=15</think>",
    "<think>98-74=24,39-24=15</think>",
    "puesto que no",  # "pues" inside a word: not the connective
]


def test_default_pattern_detects_the_teachers_connectives():
    probe = StyleProbe(num_prompts=1)
    assert [probe.detector(t) for t in TEXTS] == [True, True, False, False]
    assert style_share(TEXTS, probe.detector) == 0.5
    assert style_share([], probe.detector) == 0.0
    assert pickle.loads(pickle.dumps(probe)).detector(TEXTS[0])  # spawn-based launchers pickle callbacks


def test_custom_regex_and_callable():
    assert StyleProbe(pattern=r"\d=\d", num_prompts=1).detector("4=4")
    probe = StyleProbe(pattern=lambda text: text.endswith("</think>"), num_prompts=1)
    assert style_share(TEXTS, probe.detector) == 0.5


def test_detector_from_import_path():
    probe = StyleProbe(detector="os.path.isabs", num_prompts=1)  # any (str) -> bool callable
    assert style_share(["/abs", "rel", "/x"], probe.detector) == pytest.approx(2 / 3)


def test_share_is_logged_at_start_and_intervals(monkeypatch, fake_trainer, fake_module):
    probe = StyleProbe(num_prompts=1, every_n_steps=2)
    shares = iter([0.1, 0.4, 0.6])
    monkeypatch.setattr(probe, "share", lambda trainer, module: next(shares))
    trainer, module = fake_trainer(), fake_module(None)
    probe.on_train_start(trainer, module)
    for step in (1, 2):
        trainer.global_step = step
        probe.on_train_batch_end(trainer, module, None, None, 0)
    probe.on_train_end(trainer, module)  # same step as the last interval: not measured again
    trainer.global_step = 3
    probe.on_train_end(trainer, module)
    steps = [(s, m["style/teacher_style_share"]) for s, m in trainer.loggers[0].calls]
    assert steps == [(0, 0.1), (2, 0.4), (3, 0.6)]
    assert probe.summary() == {"style/teacher_style_share": 0.6, "style/teacher_style_share_start": 0.1}
    resumed = StyleProbe(num_prompts=1)
    resumed.load_state_dict(probe.state_dict())
    assert resumed.summary() == probe.summary()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"pattern": "(unclosed"}, r"StyleProbe.pattern '\(unclosed' is not a valid regular expression"),
        ({"detector": "no_dots"}, "StyleProbe.detector must be a dotted import path"),
        ({"detector": "os.path.no_such_function"}, "cannot be imported"),
        ({"task": "nope"}, r"StyleProbe.task must be task names from .* \(unknown: \['nope'\]\)"),
        ({"num_prompts": 0}, "StyleProbe.num_prompts must be an integer >= 1, got 0"),
        ({"pattern": 3}, "StyleProbe.pattern must be a regex string or a callable"),
    ],
)
def test_options_are_validated(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StyleProbe(**kwargs)
