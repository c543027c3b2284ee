"""Rebuild profkit's bundled data and tokenizer from ../shared/data (run once; outputs are committed).

- profkit/data/wikitext-2/valid.txt: WikiText-2 validation split, unchanged (fine-tuning text).
- profkit/data/gsm8k/test.jsonl: the first 500 GSM8K test problems (the study's inference prompts).
- profkit/data/tokenizer.json: a byte-level BPE tokenizer (4096 tokens) trained on the bundled text,
  so that no tokenizer has to be downloaded.

Usage: python analyses/bundle_data.py [--shared ../shared/data]
"""

import argparse
import shutil
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

DATA = Path(__file__).resolve().parents[1] / "profkit" / "data"
SPECIAL = ["<|bos|>", "<|eos|>", "<|pad|>"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shared", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data")
    args = parser.parse_args()

    (DATA / "wikitext-2").mkdir(parents=True, exist_ok=True)
    (DATA / "gsm8k").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(args.shared / "wikitext-2" / "valid.txt", DATA / "wikitext-2" / "valid.txt")
    shutil.copyfile(args.shared / "gsm8k" / "LICENSE", DATA / "gsm8k" / "LICENSE")
    lines = (args.shared / "gsm8k" / "test.jsonl").read_text().splitlines()[:500]
    (DATA / "gsm8k" / "test.jsonl").write_text("\n".join(lines) + "\n")

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4096, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    texts = [DATA / "wikitext-2" / "valid.txt", DATA / "gsm8k" / "test.jsonl"]
    tok.train([str(p) for p in texts], trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<|bos|> $A", special_tokens=[("<|bos|>", tok.token_to_id("<|bos|>"))])
    tok.save(str(DATA / "tokenizer.json"))
    print(f"tokenizer: {tok.get_vocab_size()} tokens -> {DATA / 'tokenizer.json'}")


if __name__ == "__main__":
    main()
