"""The token penalty and the token clip under verl (`EXPERIMENT=token_penalty`, `token_clip`).

verl's reward manager hands the caption reward only the decoded response, so the reward returns
each hallucinated mention's character span (`hallucinated_spans`, a JSON string) and the
entropy-aware trainer maps them onto the response's own token ids. Checked here on hand-made
captions (plurals, a two-word object, punctuation, a repeated mention) against the local
runner's mapping and a written-out formula: the penalty moves exactly the hallucinated tokens'
advantages by -beta, the token clip's mask reaches the batch beside `advantages`, and a step
without spans, a trainer that would ignore them or a loss that contradicts the clip stops.
"""

from __future__ import annotations

import json

import pytest
import torch

import entropyrl.verl.plugin  # noqa: F401
from entropyrl.commands.launch.recipes import EXPERIMENTS
from entropyrl.rewards.caption import SPANS_KEY, TOKEN_POSITIONS_KEY
from entropyrl.rewards.token_spans import caption_positions
from entropyrl.verl import trainer as trainer_module
from entropyrl.verl.checks.validation import clip_schedule_problems, config_problems
from entropyrl.verl.hooks import token_positions_from_spans
from entropyrl.verl.loss import HALLUCINATED_FIELD, PerSampleClipPPOLoss, hallucinated_tokens_field

from .test_trainer_hook import FakeTransferQueue, Recorder, make_trainer

# caption, the hallucinated words in it (each occurrence is a mention), reward, group
CAPTIONS = [
    ("two dogs and a cat on a sofa.", ["cat"], 1.0, "p1"),
    ("a hot dog, a hot dog and a bench", ["hot dog"], 0.0, "p1"),
    ("a man riding a horse", [], 0.5, "p1"),
    ("three giraffes near some trees.", ["giraffes"], 1.0, "p2"),
    ("a kitchen with an oven", [], 0.0, "p2"),
    ("a plate of pizza", None, 0.5, "p2"),  # CHAIR did not score it
]
BETA = 1.0


@pytest.fixture(scope="module")
def tokenizer():
    from entropyrl.rig.tokenizer import build_qwen_tokenizer

    return build_qwen_tokenizer(num_ranks=8192)


def spans_of(caption: str, words: list[str] | None) -> list[list[int]] | None:
    if words is None:
        return None
    found, start = [], 0
    for word in words:
        start = 0
        while (at := caption.find(word, start)) >= 0:
            found.append([at, at + len(word)])
            start = at + len(word)
    return sorted(found)


def fill(store: FakeTransferQueue, tokenizer, *, spans: bool = True):
    keys = []
    for i, (caption, words, score, uid) in enumerate(CAPTIONS):
        ids = torch.tensor(tokenizer.encode(caption, add_special_tokens=False))
        n = ids.shape[0]
        rm = torch.zeros(n)
        rm[-1] = score
        info = {"score": score, "chair_i": 0.0 if words is None else float(bool(words))}
        found = spans_of(caption, words)
        if spans and found is not None:
            info[SPANS_KEY] = json.dumps(found)
        key = f"{uid}_{i}_0"
        keys.append(key)
        store.rows[key] = {
            "uid": uid,
            "responses": ids,
            "response_mask": torch.ones(n, dtype=torch.int64),
            "rm_scores": rm,
            "old_log_probs": -torch.linspace(0.1, 1.0, n),
            "extra_fields": {"reward_extra_info": info},
        }
    return store.meta(keys)


def expected_mask(tokenizer) -> list[torch.Tensor]:
    """Per caption, 1.0 on the tokens the local runner's mapping marks (its own response ids)."""
    out = []
    for caption, words, _, _ in CAPTIONS:
        ids = tokenizer.encode(caption, add_special_tokens=False)
        row = torch.zeros(len(ids))
        found = spans_of(caption, words)
        if found:
            row[caption_positions(tokenizer, found, caption, ids)] = 1.0
        out.append(row)
    return out


def advantages(store, meta) -> list[torch.Tensor]:
    return [store.rows[k]["advantages"].clone() for k in meta.keys]


def run(monkeypatch, compose, tokenizer, experiment, *, spans=True):
    store = FakeTransferQueue()
    meta = fill(store, tokenizer, spans=spans)
    trainer = make_trainer(
        monkeypatch,
        compose,
        tokenizer,
        store,
        [*EXPERIMENTS[experiment], "algorithm.chair_fallback.max_fraction=1.0"],
    )
    metrics: dict = {}
    out = trainer._compute_advantage(meta, metrics)
    return store, meta, out, metrics


def test_spans_map_to_the_tokens_the_local_runner_marks(tokenizer):
    store = FakeTransferQueue()
    meta = fill(store, tokenizer)
    got = store.kv_batch_get(meta.keys, "train")
    extra = list(got["extra_fields"])
    responses = got["responses"].to_padded_tensor(0)
    mask = got["response_mask"].to_padded_tensor(0)
    positions = token_positions_from_spans(extra, responses, mask, tokenizer)
    want = [torch.nonzero(row).flatten().tolist() for row in expected_mask(tokenizer)]
    assert positions[:5] == want[:5] and positions[5] is None
    assert positions[2] == [] and positions[4] == []  # clean captions
    assert len(positions[1]) >= 4, "both tokens of each 'hot dog', twice"
    # the comma after the first "hot dog" is not a hallucinated token
    comma = [i for i, t in enumerate(responses[1].tolist()) if tokenizer.decode([t]) == ","]
    assert comma and not set(comma) & set(positions[1])
    # a reward that reports token positions itself keeps them
    extra[5] = {"reward_extra_info": {TOKEN_POSITIONS_KEY: [0, 1]}}
    assert token_positions_from_spans(extra, responses, mask, tokenizer)[5] == [0, 1]


def test_malformed_or_foreign_spans_stop_the_step(tokenizer):
    store = FakeTransferQueue()
    meta = fill(store, tokenizer)
    got = store.kv_batch_get(meta.keys, "train")
    responses = got["responses"].to_padded_tensor(0)
    mask = got["response_mask"].to_padded_tensor(0)
    extra = list(got["extra_fields"])
    extra[0] = {"reward_extra_info": {SPANS_KEY: "[[0, 400]]"}}
    with pytest.raises(ValueError, match="row 0: a hallucinated span ends past the decoded"):
        token_positions_from_spans(extra, responses, mask, tokenizer)
    extra[0] = {"reward_extra_info": {SPANS_KEY: "cat"}}
    with pytest.raises(ValueError, match="must be a JSON list of"):
        token_positions_from_spans(extra, responses, mask, tokenizer)


def test_the_token_penalty_moves_exactly_the_hallucinated_tokens(monkeypatch, compose, tokenizer):
    base_store, base_meta, _, _ = run(monkeypatch, compose, tokenizer, "baseline")
    store, meta, out, metrics = run(monkeypatch, compose, tokenizer, "token_penalty")
    assert HALLUCINATED_FIELD not in out.fields
    want = [
        adv - BETA * hall
        for adv, hall in zip(advantages(base_store, base_meta), expected_mask(tokenizer))
    ]
    for got, expected in zip(advantages(store, meta), want, strict=True):
        torch.testing.assert_close(got, expected)
    marked = int(sum(m.sum() for m in expected_mask(tokenizer)))
    assert marked > 0
    assert metrics["token_credit/penalised_tokens"] == marked
    scored_tokens = sum(len(m) for m in expected_mask(tokenizer)[:5])
    assert metrics["token_credit/hallucinated_token_frac"] == pytest.approx(marked / scored_tokens)
    assert metrics["token_credit/unscored_samples"] == 1.0


def test_the_token_clip_writes_the_mask_beside_the_advantages(monkeypatch, compose, tokenizer):
    base_store, base_meta, _, _ = run(monkeypatch, compose, tokenizer, "baseline")
    store, meta, out, metrics = run(monkeypatch, compose, tokenizer, "token_clip")
    assert HALLUCINATED_FIELD in out.fields
    for got, expected in zip(advantages(store, meta), advantages(base_store, base_meta)):
        torch.testing.assert_close(got, expected)  # the advantages are verl's
    rows = [store.rows[k][HALLUCINATED_FIELD] for k in meta.keys]
    for got, expected in zip(rows, expected_mask(tokenizer), strict=True):
        torch.testing.assert_close(got, expected)
    assert "token_credit/penalised_tokens" not in metrics
    # a micro-batch of the actor update reads it padded like its response mask
    micro = store.kv_batch_get(meta.keys[:2], "train", [HALLUCINATED_FIELD, "response_mask"])
    field = hallucinated_tokens_field(micro)
    assert field.shape == micro["response_mask"].to_padded_tensor(0).shape


def test_a_step_without_spans_stops_with_the_reward_to_use(monkeypatch, compose, tokenizer):
    for experiment in ("token_penalty", "token_clip"):
        with pytest.raises(ValueError, match=f"algorithm.{experiment} is on but no sample"):
            run(monkeypatch, compose, tokenizer, experiment, spans=False)


def initialised(compose, experiment: str):
    """A trainer of `EXPERIMENT=experiment` after verl's init hook, the config leaving verl's
    default loss."""
    trainer = trainer_module.EntropyPPOTrainer.__new__(trainer_module.EntropyPPOTrainer)
    trainer.config = compose(
        "chair_mscoco",
        [*EXPERIMENTS[experiment], "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla"],
    )
    trainer.global_steps = 0
    trainer.checkpoint_manager = Recorder()
    trainer.actor_rollout_wg = Recorder()
    trainer.on_init_end()
    return trainer


def test_the_loss_is_installed_with_the_token_clip_bounds(compose):
    trainer = initialised(compose, "token_clip")
    [loss] = [fn for name, fn in trainer.actor_rollout_wg.calls if name == "set_loss_fn"]
    assert isinstance(loss, PerSampleClipPPOLoss) and loss.token_clip == (0.2, 0.5)
    assert loss.actor_config.policy_loss.loss_mode == "per_sample_clip"


def test_the_token_penalty_alone_keeps_verls_loss(compose):
    trainer = initialised(compose, "token_penalty")
    assert not [fn for name, fn in trainer.actor_rollout_wg.calls if name == "set_loss_fn"]


def test_a_loss_or_trainer_that_would_ignore_them_is_refused(compose):
    gspo = compose(
        "chair_mscoco",
        [*EXPERIMENTS["token_clip"], "actor_rollout_ref.actor.policy_loss.loss_mode=gspo"],
    )
    assert clip_schedule_problems(gspo) == [
        "algorithm.token_clip.enable=true trains with the per_sample_clip loss, which "
        "actor_rollout_ref.actor.policy_loss.loss_mode=gspo contradicts; drop the loss_mode "
        "override, or set algorithm.token_clip.enable=false"
    ]
    for experiment in ("token_penalty", "token_clip"):
        config = compose("chair_mscoco", [*EXPERIMENTS[experiment]])
        assert config_problems(config, use_reference_policy=True) == [], experiment
        plain = compose(
            "chair_mscoco",
            [
                *EXPERIMENTS[experiment],
                "trainer.v1.trainer_mode=sync",
                "actor_rollout_ref.actor.policy_loss.loss_mode=vanilla",
            ],
        )
        assert [
            p for p in config_problems(plain, use_reference_policy=True) if experiment in p
        ] == [
            f"algorithm.{experiment}.enable=true needs the entropy-aware trainer "
            "(trainer.v1.trainer_mode=entropyrl): verl's own trainer never reads the "
            f"hallucinated tokens; set it, or algorithm.{experiment}.enable=false"
        ]
