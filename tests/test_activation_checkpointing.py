"""activation_checkpointing on the patterns of real code (issue 41): the recomputation sees what the first pass saw,
or the plan says why it stands aside. Each test is the upstream pattern, small; each failed before the fix."""
import copy
import warnings

import pytest
import torch
from corpus.peft_lora import get_peft_model
from torch import nn

import accel


def trained(model: nn.Module, plan, step, steps: int = 2, lr: float = 0.1):
    """Train the model `steps` times with `step(run, i)` (it returns the loss); the run's report, or the error."""
    run = accel.accelerate(model, torch.optim.SGD(model.parameters(), lr=lr), None, plan, device="cpu")
    torch.manual_seed(7)
    for i in range(steps):
        run.backward(step(run, i))
        run.step()
    run.close()
    return run.report


def differences(make, plan, step, steps: int = 2) -> tuple[list[str], accel.Report]:
    """The names of the state (weights, buffers) that the plan trained otherwise than the plain loop."""
    torch.manual_seed(0)
    plain = make()
    ours = copy.deepcopy(plain)
    trained(plain, [], step, steps)
    report = trained(ours, plan, step, steps)
    mine = ours.state_dict()
    return [k for k, v in plain.state_dict().items() if not torch.equal(v, mine[k])], report


def images(n: int = 4, size: int = 16, channels: int = 3) -> torch.Tensor:
    return torch.randn(n, channels, size, size, generator=torch.Generator().manual_seed(1))


def classify(batch):
    labels = torch.arange(len(batch)) % 10
    return lambda run, i: nn.functional.cross_entropy(run.model(batch.clone()), labels)


def test_densenet_layers_recompute_from_the_list_they_were_handed_not_the_longer_one():
    """torchvision's _DenseBlock hands each layer its list of features and appends to it afterwards. Before: the
    recomputation read the longer list ('running_mean should contain 32 elements not 24')."""
    torchvision = pytest.importorskip("torchvision")

    def make():
        return torchvision.models.DenseNet(growth_rate=8, block_config=(2, 2), num_init_features=16, bn_size=2,
                                           num_classes=10)

    found, report = differences(make, ["activation_checkpointing"], classify(images()))
    assert report.row("activation_checkpointing").status == "applied" and "_DenseLayer" in str(report)
    assert found == []  # weights and BatchNorm statistics, bit for bit


class SNDiscriminator(nn.Module):
    """A GAN discriminator under spectral_norm (torch.nn.utils.parametrizations), as SNGAN's: the power iteration
    updates _u and _v in every training forward and reads them in the same pass."""

    def __init__(self):
        super().__init__()
        sn = nn.utils.parametrizations.spectral_norm
        self.c1, self.c2, self.c3 = sn(nn.Conv2d(3, 8, 3, 2, 1)), sn(nn.Conv2d(8, 8, 3, 2, 1)), sn(nn.Conv2d(8, 8, 3))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = nn.functional.leaky_relu(self.c1(x), 0.1)
        x = nn.functional.leaky_relu(self.c2(x), 0.1)
        return self.head(self.c3(x).mean((2, 3)))


def test_spectral_norm_recomputes_from_the_vectors_its_forward_read_and_is_no_block_by_itself():
    """Before: the automatic choice took each ParametrizedConv2d for a repeated block (its parametrizations are
    children), the first of them receiving the batch; its recomputation started from the updated power-iteration
    vectors (the weights 1e-4 apart after a step)."""
    skipped, report = differences(SNDiscriminator, ["activation_checkpointing"], classify(images()))
    assert report.row("activation_checkpointing").status == "skipped" and "no repeated block" in str(report)
    found, report = differences(SNDiscriminator, [{"activation_checkpointing": {"modules": ["ParametrizedConv2d"]}}],
                                classify(images()))
    assert report.row("activation_checkpointing").status == "applied" and found == [] and skipped == []


class Symmetric(nn.Module):
    def forward(self, weight):
        return weight.triu() + weight.triu(1).transpose(0, 1)


class Mixer(nn.Module):
    """A block with a weight of its own under a parametrization: torch gives each such module a class of its own,
    ParametrizedMixer, made from Mixer."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)
        self.weight = nn.Parameter(torch.randn(8, 8) / 8)
        nn.utils.parametrize.register_parametrization(self, "weight", Symmetric())

    def forward(self, x):
        return x + torch.tanh(self.linear(x)) @ self.weight


def test_parametrized_blocks_answer_to_their_own_class_name():
    """Before: a parametrized Mixer's class was ParametrizedMixer (one per module), so modules=['Mixer'] found no
    module, and 'auto' no repeated block."""
    def make():
        return nn.Sequential(Mixer(), Mixer(), nn.Linear(8, 10))

    x, labels = torch.randn(4, 8, generator=torch.Generator().manual_seed(1)), torch.arange(4)
    for modules in ("auto", ["Mixer"]):
        found, report = differences(make, [{"activation_checkpointing": {"modules": modules}}],
                                    lambda run, i: nn.functional.cross_entropy(run.model(x), labels))
        assert report.row("activation_checkpointing").changes["modules"] == "2 x Mixer: 0, 1" and found == []


class CondBlock(nn.Module):
    """A conditional discriminator's block: its input and its mean map concatenated, then a convolution; the plain
    training saves the concatenation, never the input itself."""

    def __init__(self, channels_in, channels_out):
        super().__init__()
        self.conv = nn.Conv2d(channels_in + 1, channels_out, 3, padding=1)

    def forward(self, x):
        return nn.functional.leaky_relu(self.conv(torch.cat([x, x.mean(1, keepdim=True)], 1)), 0.2)


class CondDiscriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.b1, self.b2, self.head = CondBlock(3, 8), CondBlock(8, 8), nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.b2(self.b1(x)).mean((2, 3)))


def test_the_batch_changed_in_place_after_the_forward_is_recomputed_as_the_forward_saw_it():
    """The loop normalises its batch in place after the forward (for its own use of it) and before the backward.
    Before: the checkpointed first block saved the batch, and backward raised torch's 'modified by an inplace
    operation ... is at version 1; expected version 0' mid-training, where the plain loop trains."""
    batch = images()

    def step(run, i):
        x = batch.clone()
        output = run.model(x)
        x.sub_(x.mean()).div_(x.std())
        return nn.functional.cross_entropy(output, torch.arange(4))

    found, report = differences(CondDiscriminator, ["activation_checkpointing"], step)
    assert report.row("activation_checkpointing").status == "applied" and found == []


class InplaceBlock(nn.Module):
    """A pre-activation block that activates its own input in place (ReLU(inplace=True) first) beside its skip."""

    def __init__(self, width):
        super().__init__()
        self.relu, self.conv = nn.ReLU(inplace=True), nn.Conv2d(width, width, 3, padding=1)

    def forward(self, x):
        skip = x * 1.0
        return skip + self.conv(self.relu(x))


class InplaceNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.blocks = nn.Conv2d(3, 8, 3, padding=1), nn.Sequential(InplaceBlock(8), InplaceBlock(8))
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        return self.head(self.blocks(self.stem(x) + 0).mean((2, 3)))


def test_a_block_that_activates_its_own_input_in_place_is_recomputed_from_its_input_as_it_was():
    """Before: backward raised 'modified by an inplace operation' (the first pass changed the input it saved)."""
    found, report = differences(InplaceNet, ["activation_checkpointing"], classify(images()))
    assert report.row("activation_checkpointing").status == "applied" and found == []


def test_a_model_that_checkpoints_itself_is_skipped_with_where_and_trains_as_it_does():
    """timm's set_grad_checkpointing() recomputes its stages, counting BatchNorm's batches twice in the plain loop.
    Before: accel checkpointed the blocks inside again, and 33 buffers differed (num_batches_tracked 12 against 24)."""
    timm = pytest.importorskip("timm")

    def make():
        model = timm.create_model("test_resnet", num_classes=10)
        model.set_grad_checkpointing(True)
        return model

    found, report = differences(make, ["activation_checkpointing"], classify(images(size=32)))
    row = report.row("activation_checkpointing")
    assert row.status == "skipped" and "set_grad_checkpointing" in row.reason, row
    assert found == []


def gpt2(**config):
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()
    return transformers.GPT2LMHeadModel(transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=64,
                                                                n_positions=16, **config))


def language(run, i):
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(i))
    return run.model(input_ids=ids, labels=ids).loss


def test_hugging_face_models_checkpointing_themselves_or_handing_blocks_a_kv_cache_are_said():
    """gradient_checkpointing_enable(): skipped, with where (before: checkpointed twice without a word). A decoder
    whose config.use_cache is on hands every block the KV cache it appends to: refused up front."""
    def own():
        model = gpt2(use_cache=False)
        model.gradient_checkpointing_enable()
        return model

    found, report = differences(own, ["activation_checkpointing"], language)
    row = report.row("activation_checkpointing")
    assert row.status == "skipped" and "gradient_checkpointing_enable" in row.reason and found == [], row
    with pytest.raises(accel.PlanError, match=r"use_cache is True.*append again.*use_cache = False"):
        accel.accelerate(gpt2(use_cache=True), None, None, ["activation_checkpointing"], device="cpu")
    found, report = differences(lambda: gpt2(use_cache=False), ["activation_checkpointing"], language)
    assert report.row("activation_checkpointing").changes["modules"].startswith("2 x GPT2Block") and found == []


def test_blocks_are_told_apart_by_class_not_by_name():
    """peft's lora.Linear is a class named Linear with children, beside torch's Linear (lm_head). Before: both were
    'Linear' blocks, and lm_head was checkpointed."""
    transformers = pytest.importorskip("transformers")
    transformers.logging.set_verbosity_error()

    def make():
        config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=2, vocab_size=64, use_cache=False)
        return get_peft_model(transformers.LlamaForCausalLM(config))

    found, report = differences(make, ["activation_checkpointing"], language)
    modules = report.row("activation_checkpointing").changes["modules"]
    assert modules.startswith("2 x ") and "lm_head" not in modules and "model.layers.0" in modules, modules
    assert found == []
    named = differences(make, [{"activation_checkpointing": {"modules": ["corpus.peft_lora.Linear"]}}], language)
    assert "lm_head" not in named[1].row("activation_checkpointing").changes["modules"] and named[0] == []


class Cache:
    """An object a block appends to (a KV cache of one's own)."""

    def __init__(self):
        self.seen = []


class CachingBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(8, 8)

    def forward(self, x, cache):
        cache.seen.append(x.shape[0])
        return x + self.linear(x) * len(cache.seen)


class CachingNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks, self.head = nn.ModuleList([CachingBlock(), CachingBlock()]), nn.Linear(8, 10)

    def forward(self, x):
        cache = Cache()
        for block in self.blocks:
            x = block(x, cache)
        return self.head(x)


def test_a_block_handed_an_object_it_may_change_runs_that_call_without_checkpointing_and_says_so():
    batch = torch.randn(4, 8, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found, _ = differences(CachingNet, ["activation_checkpointing"], classify(batch))
    assert found == [] and any("handed Cache" in str(w.message) for w in caught), [str(w.message) for w in caught]
