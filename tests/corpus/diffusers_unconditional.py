"""diffusers' examples/unconditional_image_generation/train_unconditional.py: a UNet2DModel, a DDPMScheduler's
add_noise (the forward diffusion), the noise predicted and F.mse_loss against it (prediction_type "epsilon"), AdamW,
the cosine schedule with warm-up, clip_grad_norm_(1.0), and an EMAModel stepped after every optimizer step; each
batch as upstream, with the run's calls in the place of Accelerate's.

diffusers is not installed here, so its pieces are ported in miniature from the library's own code: UNet2DModel
(get_timestep_embedding, TimestepEmbedding, ResnetBlock2D, Downsample2D/Upsample2D, DownBlock2D/UpBlock2D handed
the tuple of skip connections, UNet2DOutput), DDPMScheduler.add_noise over the linear beta schedule, EMAModel.step
with its warm-up decay, get_cosine_schedule_with_warmup. 16x16 real digits, 8 and 16 channels."""
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}


def get_timestep_embedding(timesteps, embedding_dim, flip_sin_to_cos=False, downscale_freq_shift=1, scale=1,
                           max_period=10000):
    half_dim = embedding_dim // 2
    exponent = -math.log(max_period) * torch.arange(start=0, end=half_dim, dtype=torch.float32,
                                                    device=timesteps.device)
    exponent = exponent / (half_dim - downscale_freq_shift)
    emb = torch.exp(exponent)
    emb = timesteps[:, None].float() * emb[None, :]
    emb = scale * emb
    emb = torch.cat([torch.sin(emb), torch.cos(emb)], dim=-1)
    if flip_sin_to_cos:
        emb = torch.cat([emb[:, half_dim:], emb[:, :half_dim]], dim=-1)
    return emb


class TimestepEmbedding(nn.Module):
    def __init__(self, in_channels, time_embed_dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_channels, time_embed_dim)
        self.act = nn.SiLU()
        self.linear_2 = nn.Linear(time_embed_dim, time_embed_dim)

    def forward(self, sample):
        return self.linear_2(self.act(self.linear_1(sample)))


class ResnetBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, groups=4, dropout=0.0, output_scale_factor=1.0):
        super().__init__()
        self.norm1 = nn.GroupNorm(groups, in_channels, eps=1e-6)
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, padding=1)
        self.time_emb_proj = nn.Linear(temb_channels, out_channels)
        self.norm2 = nn.GroupNorm(groups, out_channels, eps=1e-6)
        self.dropout = nn.Dropout(dropout)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, padding=1)
        self.nonlinearity = nn.SiLU()
        self.output_scale_factor = output_scale_factor
        self.conv_shortcut = nn.Conv2d(in_channels, out_channels, 1) if in_channels != out_channels else None

    def forward(self, input_tensor, temb):
        hidden_states = self.conv1(self.nonlinearity(self.norm1(input_tensor)))
        hidden_states = hidden_states + self.time_emb_proj(self.nonlinearity(temb))[:, :, None, None]
        hidden_states = self.conv2(self.dropout(self.nonlinearity(self.norm2(hidden_states))))
        if self.conv_shortcut is not None:
            input_tensor = self.conv_shortcut(input_tensor)
        return (input_tensor + hidden_states) / self.output_scale_factor


class DownBlock2D(nn.Module):
    def __init__(self, in_channels, out_channels, temb_channels, add_downsample=True):
        super().__init__()
        self.resnets = nn.ModuleList([ResnetBlock2D(in_channels, out_channels, temb_channels),
                                      ResnetBlock2D(out_channels, out_channels, temb_channels)])
        self.downsamplers = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, stride=2, padding=1)]) \
            if add_downsample else None

    def forward(self, hidden_states, temb=None):
        output_states = ()
        for resnet in self.resnets:
            hidden_states = resnet(hidden_states, temb)
            output_states = output_states + (hidden_states,)
        if self.downsamplers is not None:
            for downsampler in self.downsamplers:
                hidden_states = downsampler(hidden_states)
            output_states = output_states + (hidden_states,)
        return hidden_states, output_states


class UpBlock2D(nn.Module):
    def __init__(self, in_channels, prev_output_channel, out_channels, temb_channels, add_upsample=True):
        super().__init__()
        resnets = []
        for i in range(3):
            res_skip_channels = in_channels if (i == 2) else out_channels
            resnet_in_channels = prev_output_channel if i == 0 else out_channels
            resnets.append(ResnetBlock2D(resnet_in_channels + res_skip_channels, out_channels, temb_channels))
        self.resnets = nn.ModuleList(resnets)
        self.upsamplers = nn.ModuleList([nn.Conv2d(out_channels, out_channels, 3, padding=1)]) if add_upsample \
            else None

    def forward(self, hidden_states, res_hidden_states_tuple, temb=None):
        for resnet in self.resnets:
            res_hidden_states = res_hidden_states_tuple[-1]
            res_hidden_states_tuple = res_hidden_states_tuple[:-1]
            hidden_states = torch.cat([hidden_states, res_hidden_states], dim=1)
            hidden_states = resnet(hidden_states, temb)
        if self.upsamplers is not None:
            for upsampler in self.upsamplers:
                hidden_states = upsampler(F.interpolate(hidden_states, scale_factor=2.0, mode="nearest"))
        return hidden_states


@dataclass
class UNet2DOutput:
    sample: torch.Tensor


class UNet2DModel(nn.Module):
    """UNet2DModel(block_out_channels=(8, 16), down DownBlock2D x 2, up UpBlock2D x 2, two resnets in the middle)."""

    def __init__(self, in_channels=1, out_channels=1, block_out_channels=(8, 16)):
        super().__init__()
        time_embed_dim = block_out_channels[0] * 4
        self.block_out_channels = block_out_channels
        self.conv_in = nn.Conv2d(in_channels, block_out_channels[0], kernel_size=3, padding=1)
        self.time_embedding = TimestepEmbedding(block_out_channels[0], time_embed_dim)
        self.down_blocks = nn.ModuleList()
        output_channel = block_out_channels[0]
        for i, channels in enumerate(block_out_channels):
            input_channel, output_channel = output_channel, channels
            self.down_blocks.append(DownBlock2D(input_channel, output_channel, time_embed_dim,
                                                add_downsample=i < len(block_out_channels) - 1))
        self.mid_block = nn.ModuleList([ResnetBlock2D(block_out_channels[-1], block_out_channels[-1], time_embed_dim),
                                        ResnetBlock2D(block_out_channels[-1], block_out_channels[-1], time_embed_dim)])
        self.up_blocks = nn.ModuleList()
        reversed_channels = list(reversed(block_out_channels))
        output_channel = reversed_channels[0]
        for i in range(len(block_out_channels)):
            prev_output_channel, output_channel = output_channel, reversed_channels[i]
            input_channel = reversed_channels[min(i + 1, len(block_out_channels) - 1)]
            self.up_blocks.append(UpBlock2D(input_channel, prev_output_channel, output_channel, time_embed_dim,
                                            add_upsample=i < len(block_out_channels) - 1))
        self.conv_norm_out = nn.GroupNorm(4, block_out_channels[0], eps=1e-5)
        self.conv_act = nn.SiLU()
        self.conv_out = nn.Conv2d(block_out_channels[0], out_channels, kernel_size=3, padding=1)

    def forward(self, sample, timestep):
        t_emb = get_timestep_embedding(timestep, self.block_out_channels[0], flip_sin_to_cos=True,
                                       downscale_freq_shift=0)
        emb = self.time_embedding(t_emb.to(dtype=sample.dtype))
        skip_sample = sample = self.conv_in(sample)
        down_block_res_samples = (sample,)
        for downsample_block in self.down_blocks:
            sample, res_samples = downsample_block(hidden_states=sample, temb=emb)
            down_block_res_samples += res_samples
        for resnet in self.mid_block:
            sample = resnet(sample, emb)
        for upsample_block in self.up_blocks:
            res_samples = down_block_res_samples[-len(upsample_block.resnets):]
            down_block_res_samples = down_block_res_samples[: -len(upsample_block.resnets)]
            sample = upsample_block(sample, res_samples, emb)
        del skip_sample
        return UNet2DOutput(sample=self.conv_out(self.conv_act(self.conv_norm_out(sample))))


class DDPMScheduler:
    """DDPMScheduler(num_train_timesteps=1000, beta_schedule="linear"): add_noise, the forward diffusion."""

    def __init__(self, num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02):
        self.num_train_timesteps = num_train_timesteps
        self.betas = torch.linspace(beta_start, beta_end, num_train_timesteps, dtype=torch.float32)
        self.alphas_cumprod = torch.cumprod(1.0 - self.betas, dim=0)

    def add_noise(self, original_samples, noise, timesteps):
        alphas_cumprod = self.alphas_cumprod.to(device=original_samples.device, dtype=original_samples.dtype)
        sqrt_alpha_prod = (alphas_cumprod[timesteps] ** 0.5).flatten()
        while len(sqrt_alpha_prod.shape) < len(original_samples.shape):
            sqrt_alpha_prod = sqrt_alpha_prod.unsqueeze(-1)
        sqrt_one_minus_alpha_prod = ((1 - alphas_cumprod[timesteps]) ** 0.5).flatten()
        while len(sqrt_one_minus_alpha_prod.shape) < len(original_samples.shape):
            sqrt_one_minus_alpha_prod = sqrt_one_minus_alpha_prod.unsqueeze(-1)
        return sqrt_alpha_prod * original_samples + sqrt_one_minus_alpha_prod * noise


class EMAModel:
    """EMAModel(parameters, decay=0.9999, use_ema_warmup=True, inv_gamma=1.0, power=3/4).step(parameters)."""

    def __init__(self, parameters, decay=0.9999, min_decay=0.0, update_after_step=0, inv_gamma=1.0, power=2 / 3):
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.decay, self.min_decay, self.update_after_step = decay, min_decay, update_after_step
        self.inv_gamma, self.power, self.optimization_step = inv_gamma, power, 0

    def get_decay(self, optimization_step):
        step = max(0, optimization_step - self.update_after_step - 1)
        if step <= 0:
            return 0.0
        cur_decay_value = 1 - (1 + step / self.inv_gamma) ** -self.power
        return max(min(cur_decay_value, self.decay), self.min_decay)

    @torch.no_grad()
    def step(self, parameters):
        self.optimization_step += 1
        one_minus_decay = 1 - self.get_decay(self.optimization_step)
        for s_param, param in zip(self.shadow_params, parameters):
            if param.requires_grad:
                s_param.sub_(one_minus_decay * (s_param - param))
            else:
                s_param.copy_(param)


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps, num_cycles=0.5):
    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * float(num_cycles) * 2.0 * progress)))

    return LambdaLR(optimizer, lr_lambda)


class Train(Loop):
    name = "train_unconditional"

    def start(self, held, run):
        self.noise_scheduler = DDPMScheduler(num_train_timesteps=1000)
        self.lr_scheduler = get_cosine_schedule_with_warmup(run.optimizer, num_warmup_steps=1, num_training_steps=8)
        self.ema_model = EMAModel(held.model.parameters(), decay=0.9999, power=3 / 4)
        self.held = held

    def step(self, index, run, held, batch, loss_of):
        clean_images = batch["input"]
        noise = torch.randn(clean_images.shape, dtype=clean_images.dtype, device=clean_images.device)
        bsz = clean_images.shape[0]
        timesteps = torch.randint(0, self.noise_scheduler.num_train_timesteps, (bsz,), device=clean_images.device)
        noisy_images = self.noise_scheduler.add_noise(clean_images, noise, timesteps)
        with run.autocast():
            model_output = run.model(noisy_images, timesteps).sample
        loss = F.mse_loss(model_output.float(), noise.float())
        run.backward(loss)
        run.unscale_gradients()
        torch.nn.utils.clip_grad_norm_(held.model.parameters(), 1.0)
        run.step()
        self.lr_scheduler.step()
        self.ema_model.step(held.model.parameters())
        return loss.detach()

    def observed(self):
        names = [n for n, _ in self.held.model.named_parameters()]
        return {f"ema {n}": p for n, p in zip(names, self.ema_model.shadow_params)}


def build() -> Setup:
    torch.manual_seed(0)
    model = UNet2DModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.95, 0.999), weight_decay=1e-6, eps=1e-08)
    images, _ = digits(size=16, samples=12)
    dataset = [{"input": image * 2 - 1} for image in images]  # transform_images: Normalize([0.5], [0.5])
    loader = DataLoader(dataset, batch_size=4, shuffle=True, generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
