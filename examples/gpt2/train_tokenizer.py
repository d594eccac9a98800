"""train_tokenizer.py — the byte-level BPE tokenizer of examples/gpt2 and the token ids it ships.

    python3 examples/gpt2/train_tokenizer.py            # (re)writes data/tokenizer.json,
                                                        # data/train.npy, data/val.npy, data/tokens.json
    python3 examples/gpt2/train_tokenizer.py --check    # tokenizes again with the shipped
                                                        # tokenizer.json and compares (exit 1 if not equal)

Input: data/kjv.txt.xz (the King James Version, public domain; data/README.md and
data/fetch_kjv.sh say where it comes from). Needs `tokenizers` (Hugging Face) and numpy.

What it does:
1. splits the text into its 1189 chapters ("Book N" heading, blank line, one verse a line);
   every 20th chapter (index % 20 == 19, 59 chapters) is the validation split, the rest training;
2. trains a GPT-2-style byte-level BPE (GPT-2's pre-tokenizer regex through ByteLevel, the 256
   byte symbols as the initial alphabet, one special token <|endoftext|>) on the TRAINING
   chapters only, asking for GPT-2's vocabulary size 50257 with min_frequency 1. The BPE trainer
   stops when every pre-token (word) of the text is a single token: this text (13,717 distinct
   pre-tokens in the training chapters) supports 20,565 entries, not 50257; the number reached
   is printed and written to data/tokens.json. The model keeps vocab_size 50257 (GPT-2's lm_head shape), so ids
   from the tokenizer's size up to 50256 simply never occur (train.py prints both numbers);
3. encodes each chapter separately, appends <|endoftext|> after each, and writes the two splits
   as uint16 .npy arrays (every id < 65536).

The BPE trainer is deterministic for the same input and tokenizers version: two runs give the
same tokenizer.json (checked with tokenizers 0.23.3).
"""
import argparse
import hashlib
import json
import lzma
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
TEXT = os.path.join(DATA, "kjv.txt.xz")
TARGET_VOCAB = 50257          # GPT-2's: 256 bytes + 50000 merges + <|endoftext|>
EOT = "<|endoftext|>"
VAL_EVERY = 20                # chapter i is validation when i % VAL_EVERY == VAL_EVERY - 1


def sha256(data):
    return hashlib.sha256(data).hexdigest()


def read_chapters(path=TEXT):
    """The text (str) and its chapters, each 'Book N\\n\\n1 verse\\n2 verse\\n...'."""
    with lzma.open(path, "rb") as f:
        raw = f.read()
    text = raw.decode("ascii")
    blocks = text.split("\n\n")          # heading, verses, heading, verses, ...
    if len(blocks) % 2 or any("\n" in h for h in blocks[0::2]):
        sys.exit(f"{path}: not the expected 'heading, blank line, verses' layout")
    chapters = [h + "\n\n" + v.rstrip("\n") + "\n" for h, v in zip(blocks[0::2], blocks[1::2])]
    return raw, chapters


def split(chapters):
    train = [c for i, c in enumerate(chapters) if i % VAL_EVERY != VAL_EVERY - 1]
    val = [c for i, c in enumerate(chapters) if i % VAL_EVERY == VAL_EVERY - 1]
    return train, val


def train_bpe(train_chapters):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    tok = Tokenizer(models.BPE())
    # GPT-2's: its regex split with the byte-to-unicode mapping, no prefix space
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=TARGET_VOCAB, min_frequency=1, special_tokens=[EOT],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(train_chapters, trainer=trainer, length=len(train_chapters))
    return tok


def encode(tok, chapters):
    eot = tok.token_to_id(EOT)
    ids = []
    for enc in tok.encode_batch(chapters):
        ids.extend(enc.ids)
        ids.append(eot)
    a = np.asarray(ids, dtype=np.int64)
    assert a.max() < 65536
    return a.astype(np.uint16)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--check", action="store_true",
                   help="tokenize with the shipped data/tokenizer.json and compare with the shipped .npy")
    p.add_argument("--out", default=DATA, help="output folder (default: data/ beside this script)")
    args = p.parse_args()

    import tokenizers
    raw, chapters = read_chapters()
    train_ch, val_ch = split(chapters)
    print(f"text: {TEXT} ({len(raw)} bytes, sha256 {sha256(raw)}), {len(chapters)} chapters: "
          f"{len(train_ch)} train, {len(val_ch)} val (every {VAL_EVERY}th)")

    if args.check:
        from tokenizers import Tokenizer
        tok = Tokenizer.from_file(os.path.join(DATA, "tokenizer.json"))
        ok = True
        for name, ch in (("train", train_ch), ("val", val_ch)):
            want = np.load(os.path.join(DATA, f"{name}.npy"))
            got = encode(tok, ch)
            same = want.shape == got.shape and bool((want == got).all())
            print(f"{name}.npy: {want.size} tokens, {'same' if same else 'DIFFERENT'}")
            ok = ok and same
        # training again must give the shipped tokenizer (deterministic trainer)
        retrained = train_bpe(train_ch).to_str()
        shipped = tok.to_str()
        same = json.loads(retrained) == json.loads(shipped)
        print(f"tokenizer.json retrained: {'same' if same else 'DIFFERENT'} "
              f"(tokenizers {tokenizers.__version__})")
        print(f"overall okay: {int(ok and same)}")
        return 0 if ok and same else 1

    tok = train_bpe(train_ch)
    V = tok.get_vocab_size()
    os.makedirs(args.out, exist_ok=True)
    tok_path = os.path.join(args.out, "tokenizer.json")
    tok.save(tok_path, pretty=False)
    tr, va = encode(tok, train_ch), encode(tok, val_ch)
    np.save(os.path.join(args.out, "train.npy"), tr)
    np.save(os.path.join(args.out, "val.npy"), va)
    with open(tok_path, "rb") as f:
        tok_sha = sha256(f.read())
    meta = {
        "text": "kjv.txt.xz", "text_sha256_uncompressed": sha256(raw),
        "source": "Debian package bible-kjv-text 4.38 (King James Version, 1611; public domain)",
        "chapters": len(chapters), "train_chapters": len(train_ch), "val_chapters": len(val_ch),
        "val_rule": f"chapter index % {VAL_EVERY} == {VAL_EVERY - 1}",
        "tokenizer": "tokenizer.json", "tokenizer_sha256": tok_sha,
        "tokenizer_trained_on": "train chapters only",
        "tokenizer_vocab_size": V, "target_vocab_size": TARGET_VOCAB,
        "model_vocab_size": TARGET_VOCAB, "eot_token": EOT, "eot_id": tok.token_to_id(EOT),
        "train_tokens": int(tr.size), "val_tokens": int(va.size), "dtype": "uint16",
        "bytes_per_token": round(len(raw) / (tr.size + va.size), 3),
        "tokenizers_version": tokenizers.__version__,
    }
    with open(os.path.join(args.out, "tokens.json"), "w") as f:
        json.dump(meta, f, indent=1)
        f.write("\n")
    print(f"tokenizer: {V} entries (asked {TARGET_VOCAB}: the text supports no more merges; "
          f"the model keeps vocab_size {TARGET_VOCAB}) -> {tok_path}")
    print(f"tokens: train {tr.size}, val {va.size} (uint16), {meta['bytes_per_token']} bytes/token")
    return 0


if __name__ == "__main__":
    sys.exit(main())
