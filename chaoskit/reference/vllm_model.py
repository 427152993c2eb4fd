"""Build the tiny Llama the vLLM engine serves, locally: a BPE tokenizer trained with `tokenizers` on a built-in
corpus and a 2-layer Llama with random weights (hidden 64, head_dim 32) saved with `transformers`. Nothing is
downloaded. Run with the vLLM venv's Python: `python -m chaoskit.reference.vllm_model OUTDIR`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def corpus() -> list[str]:
    from chaoskit.load.prompts import synthetic

    return [synthetic(64, seed) for seed in range(2000)]


def build(out: Path) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<unk>", "<s>", "</s>", "<pad>"]
    tok.train_from_iterator(corpus(), trainers.BpeTrainer(vocab_size=512, special_tokens=specials,
                                                          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   pad_token="<pad>")
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=32, max_position_embeddings=2048,
                      bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id,
                      pad_token_id=fast.pad_token_id, tie_word_embeddings=False, torch_dtype="float32")
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    (out / "chaoskit.json").write_text(json.dumps({"built_by": "chaoskit.reference.vllm_model", "vocab": len(fast)}))


if __name__ == "__main__":
    build(Path(sys.argv[1]))
