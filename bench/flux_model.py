"""Flux.1 transformer (diffusers FluxTransformer2DModel) in PyTorch eager, written independently of it.

The model, its checkpoint layouts, LoRA and input/weight helpers; bench/flux_eager.py is the
command line around it. See flux_eager.py for the numerics this follows.
"""

import json
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint as torch_checkpoint

ROPE_THETA = 10000.0  # hard-coded in diffusers' FluxPosEmbed
EPS = 1e-6  # every LayerNorm and RMSNorm of the model
MLP_RATIO = 4
TIMESTEP_CHANNELS = 256

# ---------------------------------------------------------------------------------------------
# Configuration


class FluxConfig:
    """The diffusers transformer config.json keys this model reads (defaults: FLUX.1-schnell)."""

    DEFAULTS = {
        "patch_size": 1, "in_channels": 64, "out_channels": None, "num_layers": 19,
        "num_single_layers": 38, "attention_head_dim": 128, "num_attention_heads": 24,
        "joint_attention_dim": 4096, "pooled_projection_dim": 768, "guidance_embeds": False,
        "axes_dims_rope": [16, 56, 56],
    }

    def __init__(self, values):
        merged = dict(self.DEFAULTS)
        merged.update({key: value for key, value in values.items() if key in self.DEFAULTS})
        for key, value in merged.items():
            setattr(self, key, value)
        if self.out_channels is None:
            self.out_channels = self.in_channels
        self.axes_dims_rope = [int(dim) for dim in self.axes_dims_rope]
        self._validate()

    def _validate(self):
        def positive(name, minimum=1):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
                raise ValueError(f"[FluxConfig] {name} must be an integer >= {minimum}, got {value!r}")
        for name in ("patch_size", "in_channels", "out_channels", "attention_head_dim",
                     "num_attention_heads", "joint_attention_dim", "pooled_projection_dim"):
            positive(name)
        positive("num_layers", 0)
        positive("num_single_layers", 0)
        if any(dim <= 0 or dim % 2 for dim in self.axes_dims_rope):
            raise ValueError(f"[FluxConfig] axes_dims_rope must be positive even numbers, got {self.axes_dims_rope}")
        if sum(self.axes_dims_rope) != self.attention_head_dim:
            raise ValueError(
                f"[FluxConfig] axes_dims_rope must sum to attention_head_dim = {self.attention_head_dim}, "
                f"got {self.axes_dims_rope} (sum {sum(self.axes_dims_rope)})")

    @property
    def inner_dim(self):
        return self.num_attention_heads * self.attention_head_dim

    @classmethod
    def from_json(cls, path):
        with open(path) as handle:
            return cls(json.load(handle))

    def expected_key_count(self):
        """16 top-level keys (+4 with guidance), 32 per double block, 14 per single block (diffusers' key set)."""
        top = 16 + (4 if self.guidance_embeds else 0)
        return top + 32 * self.num_layers + 14 * self.num_single_layers


# ---------------------------------------------------------------------------------------------
# Numerical primitives


def layer_norm(x):
    """LayerNorm over the last dim without affine parameters, eps 1e-6. (B, L, D) -> (B, L, D)."""
    return F.layer_norm(x, (x.shape[-1],), eps=EPS)


def gelu_tanh(x):
    return F.gelu(x, approximate="tanh")


class RMSNorm(nn.Module):
    """RMSNorm over the last dim: normalise in float32, cast back to x's dtype, times `weight`."""

    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + EPS)
        return normed.to(x.dtype) * self.weight


def timestep_sinusoid(scaled, channels=TIMESTEP_CHANNELS):
    """[cos | sin] embedding of already-scaled timesteps (B,) -> (B, channels) float32.

    freq_k = 10000^(-k/half) for k < half, computed in float32; arg = float32(t) * freq_k
    (diffusers' get_timestep_embedding).
    """
    half = channels // 2
    exponent = -math.log(10000.0) * torch.arange(half, dtype=torch.float32) / half
    arg = scaled.float()[:, None] * torch.exp(exponent)[None, :]
    return torch.cat([torch.cos(arg), torch.sin(arg)], dim=-1)


def rope_tables(ids, axes_dims, theta=ROPE_THETA):
    """cos, sin tables (N, sum(axes_dims)) float32 for position ids (N, len(axes_dims)) (diffusers' FluxPosEmbed).

    Angles are formed in float64, each repeated for the two lanes of its interleaved pair, then
    cast to float32.
    """
    positions = ids.float().double()  # diffusers reads float32 positions, then works in float64
    cos_parts, sin_parts = [], []
    for axis, dim in enumerate(axes_dims):
        inv = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        angle = torch.outer(positions[:, axis], inv)
        cos_parts.append(torch.cos(angle).repeat_interleave(2, dim=1))
        sin_parts.append(torch.sin(angle).repeat_interleave(2, dim=1))
    return torch.cat(cos_parts, dim=1).float(), torch.cat(sin_parts, dim=1).float()


def apply_rope(x, cos, sin):
    """Rotates adjacent lane pairs of x (B, N, H, d) by the angles of cos/sin (N, d); float32 math,
    result in x's dtype: out[2j] = x[2j] cos - x[2j+1] sin, out[2j+1] = x[2j+1] cos + x[2j] sin."""
    x32 = x.float()
    pairs = x32.unflatten(-1, (-1, 2))
    rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    return (x32 * cos[None, :, None, :] + rotated * sin[None, :, None, :]).to(x.dtype)


def attention(q, k, v):
    """softmax(q kᵀ / √d) v per head for (B, N, H, d) inputs -> (B, N, H*d) in q's dtype.

    Same composite as remat::compat::scaled_dot_product_attention on LibTorch 1.13: the scale
    multiplies the scores, and the softmax runs in float32.
    """
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    scores = torch.matmul(q, k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    weights = torch.softmax(scores, -1, dtype=torch.float32).to(q.dtype)
    out = torch.matmul(weights, v).transpose(1, 2)
    return out.flatten(2).to(q.dtype)


# ---------------------------------------------------------------------------------------------
# Modules (attribute names = diffusers state-dict names)


class MLPEmbedder(nn.Module):
    """linear_1 -> SiLU -> linear_2 (diffusers TimestepEmbedding / PixArtAlphaTextProjection)."""

    def __init__(self, in_dim, dim):
        super().__init__()
        self.linear_1 = nn.Linear(in_dim, dim)
        self.linear_2 = nn.Linear(dim, dim)

    def forward(self, x):
        return self.linear_2(F.silu(self.linear_1(x)))


class TimeTextEmbed(nn.Module):
    """temb (B, D) = timestep MLP (+ guidance MLP) + pooled-text MLP.

    As diffusers' CombinedTimestepGuidanceTextProjEmbeddings (CombinedTimestepTextProjEmbeddings without guidance).
    """

    def __init__(self, config):
        super().__init__()
        dim = config.inner_dim
        self.timestep_embedder = MLPEmbedder(TIMESTEP_CHANNELS, dim)
        if config.guidance_embeds:
            self.guidance_embedder = MLPEmbedder(TIMESTEP_CHANNELS, dim)
        self.text_embedder = MLPEmbedder(config.pooled_projection_dim, dim)

    def forward(self, scaled_timestep, scaled_guidance, pooled):
        temb = self.timestep_embedder(timestep_sinusoid(scaled_timestep).to(pooled.dtype))
        if scaled_guidance is not None:
            temb = temb + self.guidance_embedder(timestep_sinusoid(scaled_guidance).to(pooled.dtype))
        return temb + self.text_embedder(pooled)


class Modulation(nn.Module):
    """The `linear` of an AdaLayerNorm: temb (B, D) -> chunks of (B, D) from linear(SiLU(temb))."""

    def __init__(self, dim, chunks):
        super().__init__()
        self.chunks = chunks
        self.linear = nn.Linear(dim, chunks * dim)

    def forward(self, temb):
        return self.linear(F.silu(temb)).chunk(self.chunks, dim=1)


def modulate(x, shift, scale):
    """LN(x) * (1 + scale) + shift with (B, D) modulation broadcast over tokens."""
    return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


class GeluProjection(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.proj = nn.Linear(dim, hidden)

    def forward(self, x):
        return gelu_tanh(self.proj(x))


class FeedForward(nn.Module):
    """net.0.proj (D -> 4D), GELU-tanh, net.1 (dropout p=0: identity), net.2 (4D -> D)."""

    def __init__(self, dim):
        super().__init__()
        self.net = nn.ModuleList([GeluProjection(dim, MLP_RATIO * dim), nn.Identity(),
                                  nn.Linear(MLP_RATIO * dim, dim)])

    def forward(self, x):
        for layer in self.net:
            x = layer(x)
        return x


class JointAttention(nn.Module):
    """Double-block attention over [text ; image] with separate text projections (diffusers' FluxAttnProcessor)."""

    def __init__(self, config):
        super().__init__()
        dim, head_dim = config.inner_dim, config.attention_head_dim
        self.heads = config.num_attention_heads
        for name in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out"):
            setattr(self, name, nn.Linear(dim, dim))
        for name in ("norm_q", "norm_k", "norm_added_q", "norm_added_k"):
            setattr(self, name, RMSNorm(head_dim))
        self.to_out = nn.ModuleList([nn.Linear(dim, dim), nn.Identity()])

    def forward(self, x, c, cos, sin):
        def heads(t):
            return t.unflatten(-1, (self.heads, -1))
        q = torch.cat([self.norm_added_q(heads(self.add_q_proj(c))), self.norm_q(heads(self.to_q(x)))], dim=1)
        k = torch.cat([self.norm_added_k(heads(self.add_k_proj(c))), self.norm_k(heads(self.to_k(x)))], dim=1)
        v = torch.cat([heads(self.add_v_proj(c)), heads(self.to_v(x))], dim=1)
        out = attention(apply_rope(q, cos, sin), apply_rope(k, cos, sin), v)
        text_len = c.shape[1]
        return self.to_out[0](out[:, text_len:]), self.to_add_out(out[:, :text_len])


class SelfAttention(nn.Module):
    """Single-block attention over the joint sequence, no output projection.

    As in diffusers' FluxSingleTransformerBlock.
    """

    def __init__(self, config):
        super().__init__()
        dim, head_dim = config.inner_dim, config.attention_head_dim
        self.heads = config.num_attention_heads
        self.to_q, self.to_k, self.to_v = (nn.Linear(dim, dim) for _ in range(3))
        self.norm_q, self.norm_k = RMSNorm(head_dim), RMSNorm(head_dim)

    def forward(self, s, cos, sin):
        def heads(t):
            return t.unflatten(-1, (self.heads, -1))
        q = apply_rope(self.norm_q(heads(self.to_q(s))), cos, sin)
        k = apply_rope(self.norm_k(heads(self.to_k(s))), cos, sin)
        return attention(q, k, heads(self.to_v(s)))


def _checkpointed(fn, *args):
    return torch_checkpoint(fn, *args, use_reentrant=False)


class DoubleBlock(nn.Module):
    """transformer_blocks.{i}: (x (B, N_i, D), c (B, N_t, D)) -> (x', c'). Note the order: image
    first, as the checkpointed state tuple; diffusers' block returns (c', x')."""

    def __init__(self, config):
        super().__init__()
        dim = config.inner_dim
        self.norm1 = Modulation(dim, 6)
        self.norm1_context = Modulation(dim, 6)
        self.attn = JointAttention(config)
        self.ff = FeedForward(dim)
        self.ff_context = FeedForward(dim)

    def _ffn(self, x, c, shift, scale, gate, c_shift, c_scale, c_gate):
        x = x + gate[:, None] * self.ff(modulate(x, shift, scale))
        c = c + c_gate[:, None] * self.ff_context(modulate(c, c_shift, c_scale))
        return x, c

    def forward(self, x, c, temb, cos, sin, checkpoint_ffn=False):
        shift, scale, gate, shift_mlp, scale_mlp, gate_mlp = self.norm1(temb)
        c_shift, c_scale, c_gate, c_shift_mlp, c_scale_mlp, c_gate_mlp = self.norm1_context(temb)
        a, a_c = self.attn(modulate(x, shift, scale), modulate(c, c_shift, c_scale), cos, sin)
        x = x + gate[:, None] * a
        c = c + c_gate[:, None] * a_c
        ffn_args = (x, c, shift_mlp, scale_mlp, gate_mlp, c_shift_mlp, c_scale_mlp, c_gate_mlp)
        if checkpoint_ffn:
            return _checkpointed(self._ffn, *ffn_args)
        return self._ffn(*ffn_args)


class SingleBlock(nn.Module):
    """single_transformer_blocks.{j} on the joint sequence s = [text ; image] (B, N, D) -> (B, N, D)."""

    def __init__(self, config):
        super().__init__()
        dim = config.inner_dim
        self.norm = Modulation(dim, 3)
        self.attn = SelfAttention(config)
        self.proj_mlp = nn.Linear(dim, MLP_RATIO * dim)
        self.proj_out = nn.Linear(dim + MLP_RATIO * dim, dim)

    def _ffn(self, residual, s_mod, attn_out, gate):
        mlp = gelu_tanh(self.proj_mlp(s_mod))
        return residual + gate[:, None] * self.proj_out(torch.cat([attn_out, mlp], dim=-1))

    def forward(self, s, temb, cos, sin, checkpoint_ffn=False):
        shift, scale, gate = self.norm(temb)
        s_mod = modulate(s, shift, scale)
        attn_out = self.attn(s_mod, cos, sin)
        if checkpoint_ffn:
            return _checkpointed(self._ffn, s, s_mod, attn_out, gate)
        return self._ffn(s, s_mod, attn_out, gate)


class NormOut(nn.Module):
    """AdaLayerNormContinuous: (scale, shift) = linear(SiLU(temb)); LN(x) * (1 + scale) + shift."""

    def __init__(self, dim):
        super().__init__()
        self.linear = nn.Linear(dim, 2 * dim)

    def forward(self, x, temb):
        scale, shift = self.linear(F.silu(temb).to(x.dtype)).chunk(2, dim=1)
        return modulate(x, shift, scale)


# ---------------------------------------------------------------------------------------------
# Checkpoint layouts (SimpleTuner's simpletuner/helpers/training/gradient_checkpointing_interval.py)


def checkpoint_sequential_state(blocks, segment_size, state, run_block, segment_stride=None):
    """Runs `blocks` over the tuple `state` in windows starting at 0, stride, 2*stride, ...: the
    first `segment_size` blocks of a window run inside one non-reentrant checkpoint call, the other
    stride - segment_size blocks ("gap") eagerly. run_block(block, state) -> new state tuple."""
    stride = segment_size if segment_stride is None else segment_stride
    if segment_size < 1:
        raise ValueError(f"[checkpoint_sequential_state] segment_size must be >= 1, got {segment_size}")
    if stride < segment_size:
        raise ValueError(f"[checkpoint_sequential_state] segment_stride must be >= segment_size "
                         f"({segment_size}), got {stride}")
    blocks = list(blocks)
    state = tuple(state)
    for start in range(0, len(blocks), stride):
        segment = blocks[start:start + segment_size]

        def run_segment(*inner, segment=segment):
            for block in segment:
                inner = run_block(block, inner)
            return inner

        state = tuple(_checkpointed(run_segment, *state))
        for block in blocks[start + segment_size:start + stride]:
            state = run_block(block, state)
    return state


class Layout:
    """A parsed checkpoint layout: kind "off", "segments" (size, stride) or "ffn"."""

    def __init__(self, text):
        self.text = text
        self.kind, self.size, self.stride = "segments", 0, 0
        if text == "off":
            self.kind = "off"
        elif text == "ffn":
            self.kind = "ffn"
        else:
            parts = text.split("/")
            try:
                if len(parts) not in (1, 2):
                    raise ValueError
                self.size = int(parts[0])
                self.stride = int(parts[1]) if len(parts) == 2 else self.size
            except ValueError:
                raise ValueError(f"[layout] layout must be off, ffn, N or N/S (integers), got {text!r}") from None
            if self.size < 1 or self.stride < self.size:
                raise ValueError(f"[layout] layout N/S must have N >= 1 and S >= N, got {text!r}")

    def __repr__(self):
        return self.text


class FluxTransformer(nn.Module):
    """diffusers FluxTransformer2DModel, forward only on the base model (no controlnet, no masks)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        dim = config.inner_dim
        self.x_embedder = nn.Linear(config.in_channels, dim)
        self.context_embedder = nn.Linear(config.joint_attention_dim, dim)
        self.time_text_embed = TimeTextEmbed(config)
        self.transformer_blocks = nn.ModuleList([DoubleBlock(config) for _ in range(config.num_layers)])
        self.single_transformer_blocks = nn.ModuleList(
            [SingleBlock(config) for _ in range(config.num_single_layers)])
        self.norm_out = NormOut(dim)
        self.proj_out = nn.Linear(dim, config.patch_size ** 2 * config.out_channels)

    def forward(self, hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids,
                txt_ids, guidance=None, layout=None):
        """hidden_states (B, N_i, C_in), encoder_hidden_states (B, N_t, J), pooled (B, P),
        timestep (B,) sigma in [0, 1], img_ids (N_i, 3), txt_ids (N_t, 3) (3-D: batch 0 is used),
        guidance (B,) iff config.guidance_embeds. layout: a Layout (None = "off"); checkpointing
        runs only under grad mode. Returns (B, N_i, ps² C_out) in the activation dtype."""
        if self.config.guidance_embeds and guidance is None:
            raise ValueError("[FluxTransformer] guidance must be given: the config has guidance_embeds = true")
        if not self.config.guidance_embeds and guidance is not None:
            raise ValueError("[FluxTransformer] guidance must be None: the config has guidance_embeds = false")
        if img_ids.dim() == 3:
            img_ids = img_ids[0]
        if txt_ids.dim() == 3:
            txt_ids = txt_ids[0]
        x = self.x_embedder(hidden_states)
        # ×1000 in the activation dtype, as diffusers' FluxTransformer2DModel.forward does
        # (SimpleTuner's copy multiplies in float32).
        scaled_t = timestep.to(x.dtype) * 1000
        scaled_g = guidance.to(x.dtype) * 1000 if guidance is not None else None
        temb = self.time_text_embed(scaled_t, scaled_g, pooled_projections)
        c = self.context_embedder(encoder_hidden_states)
        cos, sin = rope_tables(torch.cat([txt_ids, img_ids], dim=0), self.config.axes_dims_rope)

        layout = layout if layout is not None and torch.is_grad_enabled() else Layout("off")
        ffn = layout.kind == "ffn"

        def run_double(block, state):
            return block(state[0], state[1], temb, cos, sin, checkpoint_ffn=ffn)

        def run_single(block, state):
            return (block(state[0], temb, cos, sin, checkpoint_ffn=ffn),)

        x, c = self._run_stack(self.transformer_blocks, (x, c), run_double, layout)
        text_len = c.shape[1]
        # One concatenation for the whole single stack (SimpleTuner), equal to diffusers' per-block
        # concatenate-and-split.
        (s,) = self._run_stack(self.single_transformer_blocks, (torch.cat([c, x], dim=1),), run_single, layout)
        x = self.norm_out(s[:, text_len:], temb)
        return self.proj_out(x)

    @staticmethod
    def _run_stack(blocks, state, run_block, layout):
        if layout.kind == "segments" and len(blocks) > 0:
            return checkpoint_sequential_state(blocks, layout.size, state, run_block, layout.stride)
        for block in blocks:
            state = run_block(block, state)
        return state


# ---------------------------------------------------------------------------------------------
# LoRA (PEFT-style, SimpleTuner's default targets)

LORA_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")


class LoRALinear(nn.Module):
    """base(x) + (alpha / r) * B(A(x)) with a frozen base Linear; A (r, in) kaiming-uniform,
    B (out, r) zeros, so training starts from the base model."""

    def __init__(self, base, rank, alpha=None):
        super().__init__()
        self.base = base
        self.scale = (alpha if alpha is not None else rank) / rank
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, dtype=base.weight.dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, dtype=base.weight.dtype))
        nn.init.kaiming_uniform_(self.lora_A, a=math.sqrt(5))

    def forward(self, x):
        return self.base(x) + F.linear(F.linear(x, self.lora_A), self.lora_B) * self.scale


def add_lora(model, rank, targets=LORA_TARGETS):
    """Freezes every parameter of `model` and wraps each Linear whose dotted name ends with one of
    `targets` (PEFT suffix matching) in a LoRALinear. Returns the number of wrapped modules."""
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    chosen = [name for name, module in model.named_modules()
              if isinstance(module, nn.Linear) and any(name == t or name.endswith("." + t) for t in targets)]
    for name in chosen:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name)
        setattr(parent, child, LoRALinear(getattr(parent, child), rank))
    return len(chosen)


# ---------------------------------------------------------------------------------------------
# Inputs and weights


def grid_shape(tokens):
    """Rows x cols of the most square grid with rows * cols = tokens (rows <= cols)."""
    rows = int(math.isqrt(tokens))
    while tokens % rows:
        rows -= 1
    return rows, tokens // rows


def image_ids(tokens):
    """(tokens, 3) float32 ids (0, row, col), row-major over a square-ish grid.

    The layout of diffusers' FluxPipeline._prepare_latent_image_ids.
    """
    rows, cols = grid_shape(tokens)
    row = torch.arange(rows, dtype=torch.float32).repeat_interleave(cols)
    col = torch.arange(cols, dtype=torch.float32).repeat(rows)
    return torch.stack([torch.zeros(tokens), row, col], dim=1)


def make_inputs(config, image_tokens, text_tokens, batch, generator, dtype=torch.float32):
    """Random model inputs (dict of tensors named as forward's arguments)."""
    def randn(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)
    inputs = {
        "hidden_states": randn(batch, image_tokens, config.in_channels),
        "encoder_hidden_states": randn(batch, text_tokens, config.joint_attention_dim),
        "pooled_projections": randn(batch, config.pooled_projection_dim),
        "timestep": torch.rand(batch, generator=generator),
        "img_ids": image_ids(image_tokens),
        "txt_ids": torch.zeros(text_tokens, 3),
    }
    if config.guidance_embeds:
        inputs["guidance"] = 1.0 + 4.0 * torch.rand(batch, generator=generator)
    return inputs


def init_weights(model, generator):
    """Seeded random weights: Linear weights and biases U(-1/√in, 1/√in) (torch's default bound),
    RMSNorm weights U(0.5, 1.5) so a lost or misplaced norm weight changes the output."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Linear):
                bound = 1.0 / math.sqrt(module.in_features)
                module.weight.copy_(torch.rand(module.weight.shape, generator=generator) * 2 * bound - bound)
                module.bias.copy_(torch.rand(module.bias.shape, generator=generator) * 2 * bound - bound)
            elif isinstance(module, RMSNorm):
                module.weight.copy_(0.5 + torch.rand(module.weight.shape, generator=generator))


def load_weights_strict(model, tensors):
    """Copies `tensors` into model's parameters (cast to their dtype); every key must match by name
    and shape, with none missing or extra."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(tensors))
    unexpected = sorted(set(tensors) - set(expected))
    if missing or unexpected:
        raise ValueError(f"[flux_eager] weights must match the model's keys exactly: "
                         f"{len(missing)} missing {missing[:5]}, {len(unexpected)} unexpected {unexpected[:5]}")
    for name, tensor in tensors.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise ValueError(f"[flux_eager] weight {name} must have shape {tuple(expected[name].shape)}, "
                             f"got {tuple(tensor.shape)}")
    model.load_state_dict({name: tensor.to(expected[name].dtype) for name, tensor in tensors.items()}, strict=True)
