"""Replaced-token detection (`bert_jax.models.rtd`, the objective `rtd`): the generator and the
discriminator in one tree, their embeddings shared as ELECTRA ("tied") and DeBERTa-v3
("disentangled") share them, the corrupted inputs and labels, where the gradients go, and a
run started from a checkpoint. Every family with a replaced-token-detection class is tested
(the registry's rows); the job itself runs in tests/conformance_test.py (arch=<model_type>)."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bert_jax.models import families, rtd
from bert_jax.models.family import Role
from bert_jax.models.params import get_at
from bert_jax.training import objectives
from bert_jax.training.objective import summarize
from tests import family_fixtures

RTD_FAMILIES = [t for t, f in families.FAMILIES.items() if Role.REPLACED_TOKEN_DETECTION in f.roles]
SHARING = {"electra": "tied", "deberta-v2": "disentangled"}
B, L, P, V = 3, 12, 4, 61


def tiny(model_type: str):
    return families.FAMILIES[model_type].config_class(
        **family_fixtures.SIZES,
        **family_fixtures.fixture_of(model_type).fields,
        vocab_size=V,
        pad_token_id=0,
    )


def pair_of(model_type: str, sharing: str | None = None) -> rtd.ReplacedTokenDetection:
    config = tiny(model_type)
    return rtd.ReplacedTokenDetection(
        config,
        generator=rtd.generator_config(config, 0.5, 0.5),
        sharing=sharing or SHARING.get(model_type, "none"),
    )


def batch() -> dict[str, jnp.ndarray]:
    rng = np.random.default_rng(0)
    mask = np.ones((B, L), np.int32)
    mask[1, 9:] = 0  # a padded row
    ids = np.where(mask == 1, rng.integers(5, V, (B, L)), 0).astype(np.int32)
    positions = np.array([[1, 3, 5, 0], [2, 4, 0, 0], [6, 7, 8, 9]], np.int32)
    weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]], np.float32)
    originals = np.take_along_axis(ids, positions, 1) * (weights > 0)
    masked = ids.copy()
    np.put_along_axis(masked, positions, np.where(weights > 0, 4, ids[:, :1]), 1)  # [MASK] = 4
    masked[:, 0] = ids[:, 0]
    return dict(
        input_ids=jnp.asarray(masked),
        attention_mask=jnp.asarray(mask),
        token_type_ids=jnp.zeros((B, L), jnp.int32),
        masked_lm_positions=jnp.asarray(positions),
        masked_lm_ids=jnp.asarray(originals.astype(np.int32)),
        masked_lm_weights=jnp.asarray(weights),
        originals=jnp.asarray(ids),
    )


def params_of(pair):
    return nn.meta.unbox(
        pair.init({"params": jax.random.PRNGKey(0)}, jnp.zeros((1, 8), jnp.int32))
    )["params"]


@pytest.fixture(params=RTD_FAMILIES)
def model_type(request):
    return request.param


def test_a_family_with_a_discriminator_is_tested_here():
    assert {"electra", "deberta-v2"} <= set(RTD_FAMILIES), RTD_FAMILIES


def test_generator_config_scales_width_and_depth():
    config = tiny(RTD_FAMILIES[0])
    gen = rtd.generator_config(config, 0.25, 0.5)
    assert (gen.hidden_size, gen.num_attention_heads, gen.num_hidden_layers) == (8, 1, 1)
    assert gen.vocab_size == config.vocab_size
    assert gen.max_position_embeddings == config.max_position_embeddings
    with pytest.raises(ValueError, match="width 0 and depth 1"):
        rtd.generator_config(config, 0, 1)


# Each family with its recipe's sharing, and ELECTRA's shapes with the other two.
CASES = [(t, SHARING.get(t, "none")) for t in RTD_FAMILIES] + [
    ("electra", s) for s in rtd.SHARINGS if s != "tied"
]


@pytest.mark.parametrize("model_type, sharing", CASES)
def test_the_pair_is_two_whole_models_sharing_their_embeddings(model_type, sharing):
    """`split` gives each model's whole tree (its class initializes the same keys and shapes),
    `join` is its inverse, and the shared tables are one: the generator's embeddings block is
    the discriminator's ("tied"); the discriminator's tables are the generator's plus a
    difference that starts at zero ("disentangled")."""
    pair = pair_of(model_type, sharing)
    params = params_of(pair)
    gen, disc = pair.split(params)
    for model, tree in ((pair.generator_model(), gen), (pair.discriminator_model(), disc)):
        want = jax.eval_shape(lambda m=model: params_of_model(m))
        assert jax.tree_util.tree_structure(want) == jax.tree_util.tree_structure(tree)
        for a, b in zip(jax.tree_util.tree_leaves(want), jax.tree_util.tree_leaves(tree)):
            assert a.shape == b.shape
    shared = pair.shared_paths()
    encoder = pair.family.encoder_name
    if sharing == "none":
        assert shared == []
    elif sharing == "tied":
        assert (encoder, "embeddings", "word_embeddings") in shared
        kept = params["generator"][encoder].get("embeddings", {})  # ELECTRA: none of it
        assert not any(path[-1] in kept for path in shared)
    else:
        words = params["discriminator"][encoder]["embeddings"]["word_embeddings"]
        np.testing.assert_array_equal(jax.tree_util.tree_leaves(words)[0], 0.0)
        assert (encoder, "embeddings", "word_embeddings") in shared
    for path in shared:
        for a, b in zip(
            jax.tree_util.tree_leaves(get_at(gen, path)),
            jax.tree_util.tree_leaves(get_at(disc, path)),
        ):
            np.testing.assert_array_equal(a, b)
    rejoined = pair.join(gen, disc)
    for a, b in zip(jax.tree_util.tree_leaves(rejoined), jax.tree_util.tree_leaves(params)):
        np.testing.assert_allclose(a, b, atol=1e-7)


def params_of_model(model):
    from bert_jax.models.params import init_params

    return nn.meta.unbox(init_params(model, jax.random.PRNGKey(0)))


def test_corrupted_tokens_and_labels(model_type):
    """The discriminator reads the original text with each masked position set to the
    generator's sample; a token is "replaced" where the sample differs from the original (a
    sample equal to it is real), never at unmasked or unused prediction slots."""
    pair = pair_of(model_type)
    params, b = params_of(pair), batch()
    inputs = {k: b[k] for k in ("input_ids", "attention_mask")}
    out = jax.jit(
        lambda p, b: pair.apply(
            {"params": p},
            **inputs,
            masked_positions=b["masked_lm_positions"],
            masked_lm_ids=b["masked_lm_ids"],
            masked_lm_weights=b["masked_lm_weights"],
            rngs={"sample": jax.random.PRNGKey(3)},
        )
    )(params, b)
    assert out.generator_logits.shape == (B, P, V)
    assert out.discriminator_logits.shape == (B, L)
    sampled = np.asarray(out.sampled)
    want = np.zeros((B, L), bool)
    for r in range(B):
        for p in range(P):
            if b["masked_lm_weights"][r, p] > 0:
                pos = int(b["masked_lm_positions"][r, p])
                want[r, pos] = sampled[r, p] != int(b["originals"][r, pos])
    np.testing.assert_array_equal(np.asarray(out.replaced), want)
    assert want.any() and not want.all()


def objective_and_model(model_type, sharing=None):
    return objectives.get_objective("rtd"), pair_of(model_type, sharing)


# DeBERTa's case with -m e2e, for the suite's time (about 15 s of op-by-op DeBERTa): the loss is
# the objective's, the same for every family, and tests/conformance_test.py trains DeBERTa-v3's
# recipe on it.
@pytest.mark.parametrize(
    "model_type",
    [f if f == "electra" else pytest.param(f, marks=pytest.mark.e2e) for f in RTD_FAMILIES],
)
def test_loss_is_mlm_plus_fifty_times_the_discriminators(model_type):
    objective, pair = objective_and_model(model_type)
    params, b = params_of(pair), batch()
    sums = objective.sums(pair, params, b, jax.random.PRNGKey(1), True)
    counts = objective.counts(b)
    assert float(counts["rtd_count"]) == float(b["attention_mask"].sum())
    want = (
        sums["mlm_loss_sum"] / counts["mlm_count"]
        + 50.0 * sums["rtd_loss_sum"] / counts["rtd_count"]
    )
    np.testing.assert_allclose(objective.loss(sums, counts), want, rtol=1e-6)
    metrics = summarize({**sums, **counts})
    assert 0 < metrics["rtd_replaced_share"] < 1
    assert {"mlm_accuracy", "rtd_accuracy", "rtd_auc", "rtd_loss"} <= set(metrics)
    # evaluation (no rng) draws the same samples every time
    a = objective.sums(pair, params, b, None, True)
    c = objective.sums(pair, params, b, None, True)
    np.testing.assert_array_equal(a["rtd_loss_sum"], c["rtd_loss_sum"])


# DeBERTa's case is e2e (a 35 s gradient compile on 2 cores); ELECTRA's cases cover each sharing.
@pytest.mark.parametrize(
    "model_type, sharing",
    [
        pytest.param(*c, marks=pytest.mark.e2e) if c[0] != "electra" else c
        for c in CASES
        if c[1] != "none"
    ],
)
def test_the_discriminators_loss_reaches_the_generator_only_through_tied_embeddings(
    model_type, sharing
):
    """No gradient through the samples: the discriminator's loss moves no generator weight;
    "tied" embeddings take both losses' gradients, "disentangled" the generator's table only
    its own (the discriminator's goes to the difference)."""
    objective, pair = objective_and_model(model_type, sharing)
    params, b = params_of(pair), batch()

    def disc_loss(p):
        sums = objective.sums(pair, p, b, jax.random.PRNGKey(1), True)
        return sums["rtd_loss_sum"]

    grads = jax.grad(disc_loss)(params)
    for leaf in jax.tree_util.tree_leaves(grads["generator"]):
        np.testing.assert_array_equal(leaf, 0.0)
    encoder = pair.family.encoder_name
    disc_words = grads["discriminator"][encoder]["embeddings"]["word_embeddings"]
    assert np.abs(jax.tree_util.tree_leaves(disc_words)[0]).max() > 0


def test_start_from_a_checkpoint_reads_it_as_the_discriminator(model_type):
    """A run from a checkpoint: the discriminator is its weights, the generator fresh but for
    the shared tables, which are the checkpoint's."""
    pair = pair_of(model_type)
    fresh = params_of(pair)
    loaded = params_of_model(pair.discriminator_model())
    loaded = jax.tree_util.tree_map(lambda x: x + 1.0, loaded)
    gen, disc = pair.split(pair.start_from(fresh, loaded))
    for a, b in zip(jax.tree_util.tree_leaves(disc), jax.tree_util.tree_leaves(loaded)):
        np.testing.assert_allclose(a, b, atol=1e-6)
    for path in pair.shared_paths():
        for a, b in zip(
            jax.tree_util.tree_leaves(get_at(gen, path)),
            jax.tree_util.tree_leaves(get_at(loaded, path)),
        ):
            np.testing.assert_allclose(a, b, atol=1e-6)
    fresh_gen, _ = pair.split(fresh)
    layer = next(k for k in fresh_gen[pair.family.encoder_name] if k != "embeddings")
    for a, b in zip(
        jax.tree_util.tree_leaves(gen[pair.family.encoder_name][layer]),
        jax.tree_util.tree_leaves(fresh_gen[pair.family.encoder_name][layer]),
    ):
        np.testing.assert_array_equal(a, b)


def test_a_family_without_a_discriminator_is_refused():
    config = families.FAMILIES["bert"].config_class(**family_fixtures.SIZES, vocab_size=V)
    pair = rtd.ReplacedTokenDetection(config, generator=config)
    with pytest.raises(ValueError, match="bert has no replaced_token_detection head"):
        params_of(pair)
    with pytest.raises(ValueError, match="embedding sharing 'shared'"):
        rtd.ReplacedTokenDetection(config, sharing="shared")
