"""pytorch/examples vision_transformer/main.py: ViT as upstream writes it (PatchExtractor built in each forward,
unfold into patches; InputEmbedding with a class token and a positional embedding of shape (batch_size, 1,
latent_size), parameters that fix the batch size; EncoderBlocks of one LayerNorm used twice, nn.MultiheadAttention
fed (batch, patches, latent) though it reads (sequence, batch, latent), a GELU MLP with dropout; an MLP head on the
class token), Adam(lr=1e-2, weight_decay=3e-2), nn.CrossEntropyLoss; TrainEval.train_fn's body with the run's calls.

Real 8x8 digits, one channel, patches of 4, latent 32, 2 heads, 2 encoders, dropout 0.1, batch 4 (upstream's
default); 16 samples, so every batch is whole, as the class token's shape requires."""
from types import SimpleNamespace

import torch
import torch.nn as nn
from torch import optim
from torch.utils.data import DataLoader, TensorDataset

from accel.testing import Loop, Setup

from . import digits

REFUSES = {}
ARGS = SimpleNamespace(patch_size=4, latent_size=32, n_channels=1, num_heads=2, num_encoders=2, dropout=0.1,
                       img_size=8, num_classes=10, lr=1e-2, weight_decay=3e-2, batch_size=4, no_cuda=True)


class PatchExtractor(nn.Module):
    def __init__(self, patch_size=16):
        super().__init__()
        self.patch_size = patch_size

    def forward(self, input_data):
        batch_size, channels, height, width = input_data.size()
        num_patches = (height // self.patch_size) * (width // self.patch_size)
        return input_data.unfold(2, self.patch_size, self.patch_size).unfold(3, self.patch_size, self.patch_size) \
            .permute(0, 2, 3, 1, 4, 5).contiguous().view(batch_size, num_patches, -1)


class InputEmbedding(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.patch_size, self.n_channels, self.latent_size = args.patch_size, args.n_channels, args.latent_size
        self.device = torch.device("cpu")  # upstream: cuda if asked and available
        self.batch_size = args.batch_size
        self.input_size = self.patch_size * self.patch_size * self.n_channels
        self.LinearProjection = nn.Linear(self.input_size, self.latent_size)
        self.class_token = nn.Parameter(torch.randn(self.batch_size, 1, self.latent_size).to(self.device))
        self.pos_embedding = nn.Parameter(torch.randn(self.batch_size, 1, self.latent_size).to(self.device))

    def forward(self, input_data):
        input_data = input_data.to(self.device)
        patchify = PatchExtractor(patch_size=self.patch_size)
        patches = patchify(input_data)
        linear_projection = self.LinearProjection(patches).to(self.device)
        b, n, _ = linear_projection.shape
        linear_projection = torch.cat((self.class_token, linear_projection), dim=1)
        pos_embed = self.pos_embedding[:, :n + 1, :]
        linear_projection += pos_embed
        return linear_projection


class EncoderBlock(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.latent_size, self.num_heads, self.dropout = args.latent_size, args.num_heads, args.dropout
        self.norm = nn.LayerNorm(self.latent_size)
        self.attention = nn.MultiheadAttention(self.latent_size, self.num_heads, dropout=self.dropout)
        self.enc_MLP = nn.Sequential(nn.Linear(self.latent_size, self.latent_size * 4), nn.GELU(),
                                     nn.Dropout(self.dropout), nn.Linear(self.latent_size * 4, self.latent_size),
                                     nn.Dropout(self.dropout))

    def forward(self, emb_patches):
        first_norm = self.norm(emb_patches)
        attention_out = self.attention(first_norm, first_norm, first_norm)[0]
        first_added = attention_out + emb_patches
        second_norm = self.norm(first_added)
        mlp_out = self.enc_MLP(second_norm)
        return mlp_out + first_added


class ViT(nn.Module):
    def __init__(self, args):
        super().__init__()
        self.num_encoders, self.latent_size = args.num_encoders, args.latent_size
        self.num_classes, self.dropout = args.num_classes, args.dropout
        self.embedding = InputEmbedding(args)
        self.encoders = nn.ModuleList([EncoderBlock(args) for _ in range(self.num_encoders)])
        self.MLPHead = nn.Sequential(nn.LayerNorm(self.latent_size), nn.Linear(self.latent_size, self.latent_size),
                                     nn.Linear(self.latent_size, self.num_classes))

    def forward(self, test_input):
        enc_output = self.embedding(test_input)
        for enc_layer in self.encoders:
            enc_output = enc_layer(enc_output)
        class_token_embed = enc_output[:, 0]
        return self.MLPHead(class_token_embed)


class Train(Loop):
    """train_fn: optimizer.zero_grad(), logits = model(images), loss = criterion(logits, labels), backward, step."""

    name = "vision_transformer"

    def start(self, held, run):
        self.criterion = nn.CrossEntropyLoss()

    def step(self, index, run, held, batch, loss_of):
        images, labels = batch
        with run.autocast():
            logits = run.model(images)
        loss = self.criterion(logits.float(), labels)
        run.backward(loss)
        run.step()
        return loss.detach()


def build() -> Setup:
    torch.manual_seed(0)
    images, labels = digits(size=ARGS.img_size, samples=16)
    model = ViT(ARGS)
    optimizer = optim.Adam(model.parameters(), lr=ARGS.lr, weight_decay=ARGS.weight_decay)
    loader = DataLoader(TensorDataset(images, labels), batch_size=ARGS.batch_size, shuffle=True,
                        generator=torch.Generator().manual_seed(0))
    return Setup(model, optimizer, loader, loop=Train())
