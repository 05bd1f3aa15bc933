#!/usr/bin/python3
"""Self-test of bench/flux_model.py (the model behind bench/flux_eager.py) and bench/safetensors_lite.py, without the C++ side.

Each check compares against an independent computation: gradients without checkpointing, RoPE and
the timestep embedding from their formulas in float64, the key set of diffusers'
FluxTransformer2DModel (the modules its __init__ and its blocks register), rotation as complex
multiplication, attention in float64.

usage: flux_eager_selftest.py [source dir]   (default: two levels above this file)
"""

import cmath
import math
import os
import sys
import tempfile
import unittest

import torch

SOURCE_DIR = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else
                             os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(SOURCE_DIR, "bench"))
import flux_model as fe  # noqa: E402
import safetensors_lite  # noqa: E402

TINY = {"num_layers": 2, "num_single_layers": 4, "attention_head_dim": 32, "num_attention_heads": 4,
        "joint_attention_dim": 64, "pooled_projection_dim": 32, "in_channels": 64, "out_channels": None,
        "guidance_embeds": True, "axes_dims_rope": [8, 12, 12], "patch_size": 1}


def tiny_config(**overrides):
    values = dict(TINY)
    values.update(overrides)
    return fe.FluxConfig(values)


def seeded_model(config, seed=0, dtype=torch.float32):
    model = fe.FluxTransformer(config)
    fe.init_weights(model, torch.Generator().manual_seed(seed))
    return model.to(dtype)


class CallCounter:
    """Counts forward calls of modules (recomputation included) through forward pre-hooks."""

    def __init__(self, modules):
        self.counts = [0] * len(modules)
        for index, module in enumerate(modules):
            module.register_forward_pre_hook(lambda *_, index=index: self._hit(index))

    def _hit(self, index):
        self.counts[index] += 1

    def reset(self):
        self.counts = [0] * len(self.counts)


def loss_and_grads(model, inputs, layout):
    model.zero_grad(set_to_none=True)
    leaves = {name: tensor.detach().clone().requires_grad_(True)
              for name, tensor in inputs.items() if name in ("hidden_states", "encoder_hidden_states",
                                                             "pooled_projections")}
    args = dict(inputs)
    args.update(leaves)
    out = model(**args, layout=fe.Layout(layout))
    loss = (out * torch.linspace(-1, 1, out.shape[-1])).square().mean()
    loss.backward()
    grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.requires_grad}
    grads.update({"input:" + name: leaf.grad.clone() for name, leaf in leaves.items()})
    return loss.detach(), grads


class CheckpointLayoutTest(unittest.TestCase):
    LAYOUTS = ["1", "2", "3", "4", "2/3", "1/2", "3/5", "8", "ffn"]

    def _compare_all_layouts(self, model, inputs):
        base_loss, base = loss_and_grads(model, inputs, "off")
        self.assertTrue(all(g.abs().sum() > 0 for g in base.values()), "a gradient is identically zero")
        for layout in self.LAYOUTS:
            loss, grads = loss_and_grads(model, inputs, layout)
            self.assertTrue(torch.allclose(loss, base_loss, rtol=1e-6, atol=0), f"layout {layout}: loss")
            self.assertEqual(set(grads), set(base))
            for name, grad in grads.items():
                diff = (grad - base[name]).abs().max().item()
                self.assertTrue(torch.allclose(grad, base[name], rtol=1e-5, atol=1e-7),
                                f"layout {layout}: grad {name} max abs diff {diff:.3g}")

    def test_full_finetune_gradients_equal_off(self):
        torch.manual_seed(0)
        config = tiny_config()
        model = seeded_model(config).train()
        inputs = fe.make_inputs(config, 16, 8, 2, torch.Generator().manual_seed(1))
        self._compare_all_layouts(model, inputs)

    def test_lora_gradients_equal_off(self):
        torch.manual_seed(0)
        config = tiny_config(guidance_embeds=False)
        model = seeded_model(config).train()
        wrapped = fe.add_lora(model, 4)
        # Double blocks: to_q, to_k, to_v, to_out.0; single blocks: to_q, to_k, to_v.
        self.assertEqual(wrapped, 4 * config.num_layers + 3 * config.num_single_layers)
        with torch.no_grad():  # B = 0 would leave every lora_A gradient zero
            for module in model.modules():
                if isinstance(module, fe.LoRALinear):
                    module.lora_B.normal_(0, 0.05)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        self.assertTrue(trainable and all(".lora_A" in n or ".lora_B" in n for n in trainable))
        inputs = fe.make_inputs(config, 16, 8, 2, torch.Generator().manual_seed(2))
        self._compare_all_layouts(model, inputs)

    def test_layouts_recompute_the_blocks_they_should(self):
        config = tiny_config(num_layers=5, num_single_layers=7)
        model = seeded_model(config).train()
        inputs = fe.make_inputs(config, 16, 8, 1, torch.Generator().manual_seed(3))
        double = CallCounter(list(model.transformer_blocks))
        single = CallCounter(list(model.single_transformer_blocks))
        ffns = CallCounter([b.ff for b in model.transformer_blocks])
        attns = CallCounter([b.attn for b in model.transformer_blocks])

        def recomputed(counter):
            return [count - 1 for count in counter.counts]

        # layout -> (double blocks recomputed, single blocks recomputed); windows restart per stack.
        expected = {
            "off": ([0] * 5, [0] * 7),
            "1": ([1] * 5, [1] * 7),
            "2": ([1] * 5, [1] * 7),
            "2/3": ([1, 1, 0, 1, 1], [1, 1, 0, 1, 1, 0, 1]),
            "1/4": ([1, 0, 0, 0, 1], [1, 0, 0, 0, 1, 0, 0]),
        }
        for layout, (want_double, want_single) in expected.items():
            for counter in (double, single):
                counter.reset()
            loss_and_grads(model, inputs, layout)
            self.assertEqual(recomputed(double), want_double, f"layout {layout}: double blocks")
            self.assertEqual(recomputed(single), want_single, f"layout {layout}: single blocks")
        for counter in (double, ffns, attns):
            counter.reset()
        loss_and_grads(model, inputs, "ffn")
        self.assertEqual(recomputed(double), [0] * 5, "ffn: whole blocks must not be recomputed")
        self.assertEqual(recomputed(attns), [0] * 5, "ffn: attention must not be recomputed")
        self.assertEqual(recomputed(ffns), [1] * 5, "ffn: every feed-forward must be recomputed")

    def test_no_checkpointing_without_grad(self):
        config = tiny_config()
        model = seeded_model(config)
        counter = CallCounter(list(model.transformer_blocks))
        inputs = fe.make_inputs(config, 16, 8, 1, torch.Generator().manual_seed(4))
        with torch.no_grad():
            out_off = model(**inputs)
            out_ckpt = model(**inputs, layout=fe.Layout("2"))
        self.assertTrue(torch.equal(out_off, out_ckpt))
        self.assertEqual(counter.counts, [2, 2])

    def test_bad_layouts_are_rejected(self):
        for text in ("0", "2/1", "x", "2/3/4", "-1", ""):
            with self.assertRaisesRegex(ValueError, r"\[layout\]"):
                fe.Layout(text)


class NumericsTest(unittest.TestCase):
    def test_rope_table_matches_float64_loop(self):
        axes = [8, 12, 12]
        ids = torch.cat([torch.zeros(5, 3), fe.image_ids(30)], dim=0)
        cos, sin = fe.rope_tables(ids, axes)
        self.assertEqual(cos.dtype, torch.float32)
        self.assertEqual(tuple(cos.shape), (35, 32))
        want_cos = torch.zeros(35, 32, dtype=torch.float64)
        want_sin = torch.zeros(35, 32, dtype=torch.float64)
        for n in range(35):
            lane = 0
            for axis, dim in enumerate(axes):
                for j in range(dim // 2):
                    angle = float(ids[n, axis]) / (10000.0 ** (2.0 * j / dim))
                    for _ in range(2):  # the two lanes of pair j
                        want_cos[n, lane], want_sin[n, lane] = math.cos(angle), math.sin(angle)
                        lane += 1
        self.assertTrue(torch.allclose(cos.double(), want_cos, rtol=0, atol=1e-7))
        self.assertTrue(torch.allclose(sin.double(), want_sin, rtol=0, atol=1e-7))
        self.assertTrue(torch.equal(cos[:5], torch.ones(5, 32)))  # text ids 0: no rotation

    def test_rope_rotates_adjacent_pairs_as_complex_numbers(self):
        torch.manual_seed(5)
        x = torch.randn(2, 6, 3, 8)
        ids = torch.stack([torch.zeros(6), torch.arange(6.0), torch.arange(6.0) * 2], dim=1)
        cos, sin = fe.rope_tables(ids, [2, 2, 4])
        out = fe.apply_rope(x, cos, sin)
        want = torch.empty_like(x, dtype=torch.float64)
        for b in range(2):
            for n in range(6):
                for h in range(3):
                    for j in range(4):
                        angle = math.atan2(float(sin[n, 2 * j]), float(cos[n, 2 * j]))
                        z = complex(float(x[b, n, h, 2 * j]), float(x[b, n, h, 2 * j + 1])) * cmath.exp(1j * angle)
                        want[b, n, h, 2 * j], want[b, n, h, 2 * j + 1] = z.real, z.imag
        self.assertTrue(torch.allclose(out.double(), want, rtol=1e-5, atol=1e-6))

    def test_timestep_sinusoid_matches_formula(self):
        t = torch.tensor([0.0, 0.25, 0.731, 1.0]) * 1000
        got = fe.timestep_sinusoid(t)
        self.assertEqual(tuple(got.shape), (4, 256))
        want = torch.zeros(4, 256, dtype=torch.float64)
        for b in range(4):
            for k in range(128):
                arg = float(t[b]) * 10000.0 ** (-k / 128.0)
                want[b, k], want[b, 128 + k] = math.cos(arg), math.sin(arg)
        # float32 arguments up to 1000 rad carry ~1e-4 rad of rounding.
        self.assertTrue(torch.allclose(got.double(), want, rtol=0, atol=2e-4))

    def test_model_scales_timestep_in_activation_dtype(self):
        for dtype in (torch.float32, torch.bfloat16):
            config = tiny_config()
            model = seeded_model(config, dtype=dtype)
            captured = {}
            for name in ("timestep_embedder", "guidance_embedder"):
                embedder = getattr(model.time_text_embed, name)
                embedder.linear_1.register_forward_pre_hook(
                    lambda _, args, name=name: captured.__setitem__(name, args[0]))
            inputs = fe.make_inputs(config, 16, 8, 3, torch.Generator().manual_seed(6), dtype)
            inputs["timestep"] = torch.tensor([0.1234567, 0.5, 0.987654])
            inputs["guidance"] = torch.tensor([3.5, 1.0, 4.321])
            with torch.no_grad():
                model(**inputs)
            for name, raw in (("timestep_embedder", inputs["timestep"]), ("guidance_embedder", inputs["guidance"])):
                scaled = raw.to(dtype) * 1000  # rounding in the activation dtype is the point
                want = torch.zeros(3, 256, dtype=torch.float64)
                for b in range(3):
                    for k in range(128):
                        arg = float(scaled[b]) * 10000.0 ** (-k / 128.0)
                        want[b, k], want[b, 128 + k] = math.cos(arg), math.sin(arg)
                got = captured[name]
                self.assertEqual(got.dtype, dtype)
                tolerance = 2e-4 if dtype == torch.float32 else 8e-3
                self.assertTrue(torch.allclose(got.double(), want.to(dtype).double(), rtol=0, atol=tolerance),
                                f"{name} {dtype}")

    def test_attention_matches_float64(self):
        torch.manual_seed(7)
        q, k, v = (torch.randn(2, 5, 3, 4) for _ in range(3))
        got = fe.attention(q, k, v)
        qd, kd, vd = (t.double().transpose(1, 2) for t in (q, k, v))
        want = torch.softmax(qd @ kd.transpose(-2, -1) / 2.0, -1) @ vd
        self.assertTrue(torch.allclose(got.double(), want.transpose(1, 2).reshape(2, 5, 12), rtol=1e-5, atol=1e-6))

    def test_rms_norm_and_grid(self):
        norm = fe.RMSNorm(4)
        with torch.no_grad():
            norm.weight.copy_(torch.tensor([1.0, 2.0, 0.5, -1.0]))
        x = torch.tensor([[1.0, -2.0, 3.0, 0.5]])
        rms = math.sqrt((1 + 4 + 9 + 0.25) / 4 + 1e-6)
        want = torch.tensor([[1 / rms, -4 / rms, 1.5 / rms, -0.5 / rms]])
        self.assertTrue(torch.allclose(norm(x), want, rtol=1e-6, atol=0))
        self.assertEqual(fe.grid_shape(64), (8, 8))
        self.assertEqual(fe.grid_shape(24), (4, 6))
        self.assertEqual(fe.grid_shape(7), (1, 7))


def expected_keys(config):
    """Key names of diffusers' FluxTransformer2DModel, enumerated independently of the model."""
    def linear(prefix):
        return [prefix + ".weight", prefix + ".bias"]
    keys = linear("x_embedder") + linear("context_embedder") + linear("norm_out.linear") + linear("proj_out")
    embedders = ["timestep_embedder", "text_embedder"] + (["guidance_embedder"] if config.guidance_embeds else [])
    for embedder in embedders:
        keys += linear(f"time_text_embed.{embedder}.linear_1") + linear(f"time_text_embed.{embedder}.linear_2")
    for i in range(config.num_layers):
        p = f"transformer_blocks.{i}."
        for name in ("norm1.linear", "norm1_context.linear", "attn.to_q", "attn.to_k", "attn.to_v",
                     "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj", "attn.to_out.0", "attn.to_add_out",
                     "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2"):
            keys += linear(p + name)
        keys += [p + f"attn.{n}.weight" for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")]
    for j in range(config.num_single_layers):
        p = f"single_transformer_blocks.{j}."
        for name in ("norm.linear", "attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp", "proj_out"):
            keys += linear(p + name)
        keys += [p + "attn.norm_q.weight", p + "attn.norm_k.weight"]
    return keys


class KeysTest(unittest.TestCase):
    def test_key_names_and_count(self):
        for guidance in (False, True):
            config = tiny_config(guidance_embeds=guidance, num_layers=3, num_single_layers=2)
            keys = list(fe.FluxTransformer(config).state_dict())
            count = 16 + 32 * config.num_layers + 14 * config.num_single_layers + (4 if guidance else 0)
            self.assertEqual(len(keys), count)
            self.assertEqual(config.expected_key_count(), count)
            self.assertEqual(sorted(keys), sorted(expected_keys(config)))

    def test_shapes_follow_the_spec(self):
        config = tiny_config()
        state = fe.FluxTransformer(config).state_dict()
        D, F = 128, 512
        self.assertEqual(tuple(state["x_embedder.weight"].shape), (D, 64))
        self.assertEqual(tuple(state["context_embedder.weight"].shape), (D, 64))
        self.assertEqual(tuple(state["time_text_embed.timestep_embedder.linear_1.weight"].shape), (D, 256))
        self.assertEqual(tuple(state["time_text_embed.text_embedder.linear_1.weight"].shape), (D, 32))
        self.assertEqual(tuple(state["transformer_blocks.0.norm1.linear.weight"].shape), (6 * D, D))
        self.assertEqual(tuple(state["transformer_blocks.1.attn.norm_added_k.weight"].shape), (32,))
        self.assertEqual(tuple(state["transformer_blocks.0.ff.net.2.weight"].shape), (D, F))
        self.assertEqual(tuple(state["single_transformer_blocks.3.norm.linear.weight"].shape), (3 * D, D))
        self.assertEqual(tuple(state["single_transformer_blocks.0.proj_out.weight"].shape), (D, D + F))
        self.assertEqual(tuple(state["norm_out.linear.weight"].shape), (2 * D, D))
        self.assertEqual(tuple(state["proj_out.weight"].shape), (64, D))

    def test_strict_loading_rejects_mismatches(self):
        config = tiny_config()
        model = fe.FluxTransformer(config)
        state = dict(model.state_dict())
        extra = dict(state, **{"bogus.weight": torch.zeros(1)})
        with self.assertRaisesRegex(ValueError, "1 unexpected"):
            fe.load_weights_strict(model, extra)
        state.pop("proj_out.bias")
        with self.assertRaisesRegex(ValueError, "1 missing"):
            fe.load_weights_strict(model, state)
        bad = dict(model.state_dict(), **{"proj_out.bias": torch.zeros(3)})
        with self.assertRaisesRegex(ValueError, "proj_out.bias must have shape"):
            fe.load_weights_strict(model, bad)

    def test_config_validation(self):
        with self.assertRaisesRegex(ValueError, "axes_dims_rope must sum"):
            tiny_config(axes_dims_rope=[8, 8, 8])
        with self.assertRaisesRegex(ValueError, "num_attention_heads must be"):
            tiny_config(num_attention_heads=0)


class SafetensorsTest(unittest.TestCase):
    def test_round_trip_every_dtype(self):
        torch.manual_seed(8)
        tensors = {
            "f32": torch.randn(3, 4), "f64": torch.randn(2, 2, dtype=torch.float64),
            "f16": torch.randn(5).half(), "bf16": torch.randn(2, 3).bfloat16(),
            "i64": torch.arange(-3, 3), "i32": torch.arange(6, dtype=torch.int32).reshape(2, 3),
            "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 4),
        }
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "t.safetensors")
            safetensors_lite.save_file(tensors, path, metadata={"format": "pt"})
            with open(path, "rb") as handle:
                raw = handle.read()
            header_len = int.from_bytes(raw[:8], "little")
            self.assertIn(b'"bf16":{"dtype":"BF16","shape":[2,3]', raw[8:8 + header_len])
            loaded, metadata = safetensors_lite.load_file(path)
            self.assertEqual(metadata, {"format": "pt"})
            self.assertEqual(set(loaded), set(tensors))
            for name, tensor in tensors.items():
                self.assertEqual(loaded[name].dtype, tensor.dtype, name)
                self.assertTrue(torch.equal(loaded[name], tensor), name)
            self.assertEqual(os.listdir(directory), ["t.safetensors"])  # no temporary left behind

    def test_bf16_bytes_are_the_upper_halves_of_float32(self):
        values = torch.tensor([1.0, -2.5, 3.140625])
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "b.safetensors")
            safetensors_lite.save_file({"x": values.bfloat16()}, path)
            with open(path, "rb") as handle:
                raw = handle.read()
        payload = raw[8 + int.from_bytes(raw[:8], "little"):]
        want = b"".join(int(torch.tensor([v]).view(torch.int32)) .to_bytes(4, "little", signed=True)[2:]
                        for v in values.tolist())
        self.assertEqual(payload, want)

    def test_malformed_files_are_rejected(self):
        with tempfile.TemporaryDirectory() as directory:
            path = os.path.join(directory, "bad.safetensors")
            with open(path, "wb") as handle:
                handle.write((1000).to_bytes(8, "little") + b"{}")
            with self.assertRaisesRegex(safetensors_lite.SafetensorsError, "header length"):
                safetensors_lite.load_file(path)
            header = b'{"x":{"dtype":"F32","shape":[4],"data_offsets":[0,8]}}'
            with open(path, "wb") as handle:
                handle.write(len(header).to_bytes(8, "little") + header + bytes(8))
            with self.assertRaisesRegex(safetensors_lite.SafetensorsError, "must hold 16 bytes"):
                safetensors_lite.load_file(path)


if __name__ == "__main__":
    # One thread: tiny tensors gain nothing from more, and OpenMP spinning on a shared, loaded
    # machine made two threads 20x slower.
    torch.set_num_threads(1)
    unittest.main(verbosity=2)
