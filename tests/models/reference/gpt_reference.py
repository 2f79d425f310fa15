#!/usr/bin/python3
"""The PyTorch reference of tests/models/gpt_test.cpp: a 2-layer GPT, nanoGPT's model.

Writes gpt_reference.safetensors beside this script: the initial weights (drawn here,
GPT-2's initialisation), a batch, the loss and every gradient at the initial weights,
and the losses and the weights after 3 AdamW steps (nanoGPT's configure_optimizers:
weight decay on the 2-D weights only). The C++ test loads the same initial weights into
models::GPT, takes the same steps and compares every number.

The model below is nanoGPT's model.py (github.com/karpathy/nanoGPT) with the attention
written out as its non-flash path (torch 1.13 has no scaled_dot_product_attention) and
the causal mask a non-persistent buffer, so that the state_dict's keys are exactly those
of nanoGPT on torch >= 2 (and of minigrad's checkpoints). Dropout 0, for exact numbers.

Run: /usr/bin/python3 tests/models/reference/gpt_reference.py   (Debian's python3-torch 1.13)
     /usr/bin/python3 tests/models/reference/gpt_reference.py --load CHECKPOINT
         loads a checkpoint written by minigrad (train_gpt --save) with strict=True,
         for the config in its metadata, and prints the loss on a batch of the checkpoint
"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn as nn
from torch.nn import functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
CONFIG = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16, dropout=0.0, bias=True)
BATCH, T = 3, 7  # T < block_size: the position embedding's last rows get no gradient
STEPS = 3
OPTIM = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


class LayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class CausalSelfAttention(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_attn = nn.Linear(c["n_embd"], 3 * c["n_embd"], bias=c["bias"])
        self.c_proj = nn.Linear(c["n_embd"], c["n_embd"], bias=c["bias"])
        self.attn_dropout = nn.Dropout(c["dropout"])
        self.resid_dropout = nn.Dropout(c["dropout"])
        self.n_head, self.n_embd = c["n_head"], c["n_embd"]
        mask = torch.tril(torch.ones(c["block_size"], c["block_size"]))
        self.register_buffer("bias", mask.view(1, 1, c["block_size"], c["block_size"]),
                             persistent=False)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c_fc = nn.Linear(c["n_embd"], 4 * c["n_embd"], bias=c["bias"])
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * c["n_embd"], c["n_embd"], bias=c["bias"])
        self.dropout = nn.Dropout(c["dropout"])

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln_1 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.attn = CausalSelfAttention(c)
        self.ln_2 = LayerNorm(c["n_embd"], bias=c["bias"])
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.config = c
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(c["vocab_size"], c["n_embd"]),
            wpe=nn.Embedding(c["block_size"], c["n_embd"]),
            drop=nn.Dropout(c["dropout"]),
            h=nn.ModuleList([Block(c) for _ in range(c["n_layer"])]),
            ln_f=LayerNorm(c["n_embd"], bias=c["bias"]),
        ))
        self.lm_head = nn.Linear(c["n_embd"], c["vocab_size"], bias=False)
        self.transformer.wte.weight = self.lm_head.weight
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                torch.nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * c["n_layer"]))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                torch.nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            torch.nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def forward(self, idx, targets):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        x = self.transformer.ln_f(x)
        logits = self.lm_head(x)
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)
        return logits, loss

    def configure_optimizers(self, weight_decay, lr, betas, eps):
        params = [p for _, p in self.named_parameters() if p.requires_grad]
        groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
                  {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, eps=eps)


# ---- safetensors without the safetensors package (as tests/nn/reference/check_safetensors.py)
def save_safetensors(tensors, path, metadata):
    header, offset, payload = {}, 0, b""
    for name in sorted(tensors):
        t = tensors[name].detach().contiguous()
        dtype = {torch.float32: "F32", torch.int64: "I64"}[t.dtype]
        raw = t.numpy().tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
        payload += raw
    header["__metadata__"] = metadata
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + payload)


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    out = {}
    for name, info in header.items():
        dtype = {"F32": torch.float32, "I64": torch.int64}[info["dtype"]]
        begin, end = info["data_offsets"]
        raw = bytearray(data[8 + n + begin:8 + n + end])
        out[name] = torch.frombuffer(raw, dtype=dtype).reshape(info["shape"]).clone()
    return out, metadata


def write_reference():
    torch.manual_seed(1234)
    model = GPT(CONFIG)
    idx = torch.randint(0, CONFIG["vocab_size"], (BATCH, T))
    targets = torch.randint(0, CONFIG["vocab_size"], (BATCH, T))
    targets[1, 3] = -1  # ignored, as nanoGPT's ignore_index
    out = {"idx": idx, "targets": targets}
    for name, t in model.state_dict().items():
        if name != "lm_head.weight":
            out["init." + name] = t.clone()
    opt = model.configure_optimizers(OPTIM["weight_decay"], OPTIM["lr"], OPTIM["betas"],
                                     OPTIM["eps"])
    losses = []
    for step in range(STEPS):
        opt.zero_grad(set_to_none=True)
        logits, loss = model(idx, targets)
        loss.backward()
        losses.append(loss.item())
        if step == 0:
            out["logits"] = logits.detach().clone()
            for name, p in model.named_parameters():
                out["grad." + name] = p.grad.clone()
        opt.step()
    _, loss = model(idx, targets)
    losses.append(loss.item())
    out["losses"] = torch.tensor(losses, dtype=torch.float32)
    for name, p in model.named_parameters():
        out["after." + name] = p.detach().clone()
    metadata = {"torch": torch.__version__, "config": json.dumps(CONFIG),
                "optimizer": json.dumps(OPTIM), "steps": str(STEPS)}
    path = os.path.join(HERE, "gpt_reference.safetensors")
    save_safetensors(out, path, metadata)
    print(f"wrote {path}: losses {losses}")


def load_checkpoint(path):
    tensors, metadata = load_safetensors(path)
    config = json.loads(metadata["gpt_config"])
    model = GPT(config)
    state = {k[len("model."):]: v for k, v in tensors.items() if k.startswith("model.")}
    model.load_state_dict(state, strict=True)
    torch.manual_seed(0)
    idx = torch.randint(0, config["vocab_size"], (2, config["block_size"]))
    with torch.no_grad():
        _, loss = model(idx[:, :-1].contiguous(), idx[:, 1:].contiguous())
    print(f"loaded {path} with strict=True: {sum(p.numel() for p in model.parameters())} "
          f"parameters, loss on a random batch {loss.item():.4f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--load":
        load_checkpoint(sys.argv[2])
    else:
        write_reference()
