"""peft's LoRA (src/peft/tuners/lora/layer.py, class Linear; get_peft_model with LoraConfig(r=8, lora_alpha=16,
lora_dropout=0.05, target_modules=["q_proj", "v_proj"])) on a Llama causal LM built from its config, trained as
peft's causal-LM examples do: only the adapters train (the base model frozen), AdamW, outputs.loss, with
model.config.use_cache = False for training, as those scripts set.

peft is not installed here, so its LoRA layer is ported: a module whose class is named ``Linear`` (as peft's is)
wrapping the base nn.Linear with lora_A, lora_B (ModuleDicts by adapter name), lora_dropout and scaling
lora_alpha / r; lora_A kaiming-uniform, lora_B zeros; forward = base_layer(x) + lora_B(lora_A(dropout(x))) * scaling.
Two classes named Linear in one model (this one and lm_head's torch Linear): activation_checkpointing's automatic
choice must tell them apart (before, it checkpointed lm_head)."""
import math

import torch
from torch import nn
from torch.utils.data import DataLoader

from accel.testing import Setup

from . import NoTrainer, tokens

REFUSES = {}


class Linear(nn.Module):
    """peft.tuners.lora.layer.Linear, vanilla LoRA, one adapter ("default")."""

    def __init__(self, base_layer: nn.Linear, adapter_name="default", r=8, lora_alpha=16, lora_dropout=0.05):
        super().__init__()
        self.base_layer = base_layer
        self.in_features, self.out_features = base_layer.in_features, base_layer.out_features
        self.lora_A, self.lora_B = nn.ModuleDict(), nn.ModuleDict()
        self.lora_dropout = nn.ModuleDict({adapter_name: nn.Dropout(p=lora_dropout) if lora_dropout > 0.0
                                           else nn.Identity()})
        self.scaling = {adapter_name: lora_alpha / r}
        self.lora_A[adapter_name] = nn.Linear(self.in_features, r, bias=False)
        self.lora_B[adapter_name] = nn.Linear(r, self.out_features, bias=False)
        nn.init.kaiming_uniform_(self.lora_A[adapter_name].weight, a=math.sqrt(5))
        nn.init.zeros_(self.lora_B[adapter_name].weight)
        self.active_adapters = [adapter_name]

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        result = self.base_layer(x, *args, **kwargs)
        torch_result_dtype = result.dtype
        for active_adapter in self.active_adapters:
            lora_A = self.lora_A[active_adapter]
            lora_B = self.lora_B[active_adapter]
            dropout = self.lora_dropout[active_adapter]
            scaling = self.scaling[active_adapter]
            x = x.to(lora_A.weight.dtype)
            result = result + lora_B(lora_A(dropout(x))) * scaling
        return result.to(torch_result_dtype)


def get_peft_model(model: nn.Module, target_modules=("q_proj", "v_proj")) -> nn.Module:
    """Inject LoRA into every target nn.Linear, then train only the adapters (mark_only_lora_as_trainable)."""
    for name, module in list(model.named_modules()):
        if name.rpartition(".")[2] in target_modules and isinstance(module, nn.Linear):
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner), attr, Linear(module))
    for name, param in model.named_parameters():
        param.requires_grad_("lora_" in name)
    return model


class Train(NoTrainer):
    name = "peft_lora"


def build() -> Setup:
    import transformers

    transformers.logging.set_verbosity_error()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=128, max_position_embeddings=32)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.config.use_cache = False  # silence the warnings. Please re-enable for inference!
    model = get_peft_model(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    ids = tokens(16 * 12, config.vocab_size).view(12, 16)
    dataset = [{"input_ids": row, "attention_mask": torch.ones_like(row), "labels": row.clone()} for row in ids]
    loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
