#!/usr/bin/python3
"""The PyTorch reference of tests/models/llama_test.cpp: a 2-layer Llama, written out here.

The model below is HF transformers' LlamaForCausalLM (modeling_llama.py, the 4.3x versions
whose LlamaAttention holds its own rotary_emb) reduced to what training needs: module for
module and name for name (model.embed_tokens, model.layers.N.self_attn.q_proj, ...,
model.norm, lm_head), so its state_dict has exactly HF's keys, and minigrad's must load into
it with strict=True. RMSNorm, rotate_half RoPE, repeat_kv and SwiGLU are HF's formulas; the
attention is written out (torch 1.13 has no scaled_dot_product_attention). Everything is
float64, so the C++ test's float64 run agrees to rounding.

For each of num_key_value_heads 1 (multi-query), 2 (grouped) and 4 (= num_attention_heads,
multi-head) it writes, under the prefix "kv<n>.": the initial weights (HF's initialisation,
N(0, 0.02)), the logits, the loss and every gradient at them, and the losses and the weights
after 3 AdamW steps (weight decay on the 2-D weights only, as nanoGPT's and torchtitan's).

Run: /usr/bin/python3 tests/models/reference/llama_reference.py   (Debian's python3-torch 1.13)
"""
import json
import math
import os
import struct

import torch
import torch.nn as nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = dict(vocab_size=13, hidden_size=16, intermediate_size=40, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16,
              rms_norm_eps=1e-5, rope_theta=10000.0)
BATCH, T = 3, 7
STEPS = 3
OPTIM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.variance_epsilon))


class LlamaRotaryEmbedding(nn.Module):
    def __init__(self, dim, base):
        super().__init__()
        inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not in the state_dict

    def forward(self, seq_len):
        t = torch.arange(seq_len, dtype=torch.float64)
        freqs = torch.outer(t, self.inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos(), emb.sin()


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, kv, t, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, kv, n_rep, t, d).reshape(b, kv * n_rep, t, d)


class LlamaAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.num_heads, self.num_kv = c["num_attention_heads"], c["num_key_value_heads"]
        self.head_dim = c["hidden_size"] // self.num_heads
        self.q_proj = nn.Linear(c["hidden_size"], self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(c["hidden_size"], self.num_kv * self.head_dim, bias=False)
        self.v_proj = nn.Linear(c["hidden_size"], self.num_kv * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, c["hidden_size"], bias=False)
        self.rotary_emb = LlamaRotaryEmbedding(self.head_dim, c["rope_theta"])

    def forward(self, x):
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv, self.head_dim).transpose(1, 2)
        cos, sin = self.rotary_emb(t)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        k, v = repeat_kv(k, self.num_heads // self.num_kv), repeat_kv(v, self.num_heads // self.num_kv)
        att = (q @ k.transpose(2, 3)) / math.sqrt(self.head_dim)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).tril().logical_not(), float("-inf"))
        y = torch.softmax(att, dim=-1) @ v
        return self.o_proj(y.transpose(1, 2).reshape(b, t, -1))


class LlamaMLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.gate_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.up_proj = nn.Linear(c["hidden_size"], c["intermediate_size"], bias=False)
        self.down_proj = nn.Linear(c["intermediate_size"], c["hidden_size"], bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])
        self.post_attention_layernorm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.embed_tokens = nn.Embedding(c["vocab_size"], c["hidden_size"])
        self.layers = nn.ModuleList([LlamaDecoderLayer(c) for _ in range(c["num_hidden_layers"])])
        self.norm = LlamaRMSNorm(c["hidden_size"], c["rms_norm_eps"])

    def forward(self, idx):
        x = self.embed_tokens(idx)
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


class LlamaForCausalLM(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.model = LlamaModel(c)
        self.lm_head = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False)
        for m in self.modules():  # HF's _init_weights, initializer_range 0.02
            if isinstance(m, (nn.Linear, nn.Embedding)):
                torch.nn.init.normal_(m.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        logits = self.lm_head(self.model(idx))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss


def save_safetensors(tensors, path, metadata):
    header, offset, payload = {}, 0, b""
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dtype = {torch.float64: "F64", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        payload += raw
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)


def main():
    torch.set_default_dtype(torch.float64)
    out = {}
    torch.manual_seed(1234)
    idx = torch.randint(0, CONFIG["vocab_size"], (BATCH, T))
    targets = torch.randint(0, CONFIG["vocab_size"], (BATCH, T))
    targets[1, 3] = -1  # ignored
    out["idx"], out["targets"] = idx, targets
    for kv in (1, 2, 4):
        c = dict(CONFIG, num_key_value_heads=kv)
        model = LlamaForCausalLM(c)
        prefix = f"kv{kv}."
        # What strict=True loading checks: the state_dict's keys are the parameters' names.
        assert set(model.state_dict()) == {n for n, _ in model.named_parameters()}
        for name, t in model.state_dict().items():
            out[prefix + "init." + name] = t.clone()
        params = [p for p in model.parameters()]
        opt = torch.optim.AdamW([{"params": [p for p in params if p.dim() >= 2], "weight_decay": OPTIM["weight_decay"]},
                                 {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                                lr=OPTIM["lr"], betas=OPTIM["betas"], eps=OPTIM["eps"])
        losses = []
        for step in range(STEPS):
            opt.zero_grad(set_to_none=True)
            logits, loss = model(idx, targets)
            loss.backward()
            losses.append(loss.item())
            if step == 0:
                out[prefix + "logits"] = logits.detach().clone()
                for name, p in model.named_parameters():
                    out[prefix + "grad." + name] = p.grad.clone()
            opt.step()
        with torch.no_grad():
            losses.append(model(idx, targets)[1].item())
        out[prefix + "losses"] = torch.tensor(losses)
        for name, p in model.named_parameters():
            out[prefix + "after." + name] = p.detach().clone()
        print(f"num_key_value_heads {kv}: losses {losses}")
    metadata = {"torch": torch.__version__, "config": json.dumps(CONFIG), "optimizer": json.dumps(OPTIM),
                "steps": str(STEPS)}
    path = os.path.join(HERE, "llama_reference.safetensors")
    save_safetensors(out, path, metadata)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
