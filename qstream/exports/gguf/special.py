"""A tokenizer's special tokens, merges and chat template as GGUF keys, read from
``tokenizer.json``, ``tokenizer_config.json``, ``config.json`` and ``chat_template.jinja`` /
``chat_template.json`` the way gguf-py's ``SpecialVocab`` (llama.cpp's converter) reads them:
:func:`special_items`."""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from ...errors import InvalidParameterError
from .items import ARRAY, BOOL, STRING, UINT32, MetaItem, read_json

#: the special token kinds read, and the GGUF key of each one's id (``cls`` has none: skipped)
TYPES = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")
ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # (llama.cpp's spelling)
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
}
ADD_KEYS = {"bos": "tokenizer.ggml.add_bos_token", "eos": "tokenizer.ggml.add_eos_token",
            "sep": "tokenizer.ggml.add_sep_token"}  # fmt: skip


class _Special:
    """What ``SpecialVocab`` collects: ids by kind (first found wins), add flags, merges,
    chat template, normalizer flags."""

    def __init__(self, n_vocab: int | None) -> None:
        self.n_vocab = n_vocab
        self.types: tuple[str, ...] = TYPES
        self.ids: dict[str, int] = {}
        self.add: dict[str, bool] = {}
        self.merges: list[str] = []
        self.chat_template: Any = None
        self.lowercase: bool | None = None
        self.strip_accents: bool | None = None

    def set_id(self, kind: str, tid: Any) -> None:
        if not isinstance(tid, int) or isinstance(tid, bool):
            return
        if tid < 0:
            raise InvalidParameterError(f"special token {kind}: a negative id {tid}")
        if (self.n_vocab is None or tid < self.n_vocab) and kind not in self.ids:
            self.ids[kind] = tid

    def normalizer(self, norm: dict[str, Any]) -> None:
        kind = norm.get("type")
        if kind == "Lowercase":
            self.lowercase = True
        elif kind == "StripAccents":
            self.strip_accents = True
        elif kind == "BertNormalizer":
            if "lowercase" in norm:
                self.lowercase = norm["lowercase"]
            if "strip_accents" in norm:
                self.strip_accents = norm["strip_accents"]
        elif kind == "Sequence":
            for n in norm.get("normalizers", []):
                self.normalizer(n)


def _merges(raw: Any, where: Path) -> list[str]:
    if not isinstance(raw, list) or not raw:
        return []
    if isinstance(raw[0], str):
        return list(raw)
    if isinstance(raw[0], list) and len(raw[0]) == 2 and isinstance(raw[0][0], str):
        # (pairs: a space inside a part is written as U+0120 + 256, as the converter does)
        def part(p: str) -> str:
            return p.replace(" ", chr(ord(" ") + 256))

        return [f"{part(a)} {part(b)}" for a, b in raw]
    raise InvalidParameterError(f"{where}: merges in a format llama.cpp does not know")


def _merges_txt(path: Path) -> list[str]:
    out: list[str] = []
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    if lines and lines[0].strip().startswith("#"):
        lines = lines[1:]
    for line in lines:
        parts = line.strip().split(None, 3)
        if len(parts) == 2:
            out.append(f"{parts[0]} {parts[1]}")
    return out


def _special_id(entry: Any) -> Any:
    return (entry or {}).get("SpecialToken", {}).get("id") if isinstance(entry, dict) else None


def _template(sv: _Special, proc: dict[str, Any], tc: dict[str, Any] | None,
              found: dict[str, Any]) -> None:  # fmt: skip
    """A TemplateProcessing post-processor: whether bos / eos / sep are added (the simple
    templates the converter understands)."""
    single, pair = proc.get("single", []), proc.get("pair", [])
    first = last = None
    if len(single) > 1:
        first = _special_id(single[0])
        if first:
            if not tc:
                found["bos"] = first
            elif first not in (found["bos"], found["cls"]):
                if not found["bos"]:
                    tc["bos_token"] = found["bos"] = first
                if not found["cls"]:
                    tc["cls_token"] = found["cls"] = first
            sv.add["bos"] = first in (found["bos"], found["cls"])
        last = _special_id(single[-1])
        if last:
            if not tc:
                found["eos"] = last
            elif last != found["eos"]:
                for extra in ("eot", "eom"):
                    if extra not in sv.types:
                        sv.types = (*sv.types, extra)
                        tc[f"{extra}_token"] = found["eos"]
                        break
                tc["eos_token"] = found["eos"] = last
            sv.add["eos"] = last == found["eos"]
    if not pair:
        return
    start = 1 if first and _special_id(pair[0]) == first else 0
    stop = -1 if last and _special_id(pair[-1]) == last else None
    pair = pair[start:stop]
    if not pair:
        return
    a = (pair[0].get("Sequence") or {}).get("id")
    b = (pair[-1].get("Sequence") or {}).get("id")
    middle = pair[1:-1]
    if a != "A" or b != "B" or not middle:
        return
    add_sep = False
    entry = _special_id(middle[0])
    if entry and entry in (found["sep"], found["eos"]) and not last:
        add_sep = True
    if len(middle) == 2:
        entry = _special_id(middle[1])
        if entry and entry in (found["sep"], found["eos"]):
            add_sep = True
    sv.add["sep"] = add_sep
    if add_sep and not found["sep"] and tc:
        tc["sep_token"] = found["eos"]


def _from_tokenizer_files(sv: _Special, root: Path, load_merges: bool) -> None:
    spec = read_json(root / "tokenizer.json") if (root / "tokenizer.json").is_file() else None
    added: list[dict[str, Any]] = []
    if spec is not None:
        if load_merges:
            sv.merges = _merges((spec.get("model") or {}).get("merges"), root / "tokenizer.json")
        if spec.get("normalizer"):
            sv.normalizer(spec["normalizer"])
        added = spec.get("added_tokens") or []
    tc_path = root / "tokenizer_config.json"
    tc: dict[str, Any] | None = read_json(tc_path) if tc_path.is_file() else None
    if spec:
        found = {k: (tc or {}).get(f"{k}_token") for k in ("bos", "cls", "eos", "sep")}
        if not found["bos"] and found["cls"] and tc:
            tc["bos_token"] = found["bos"] = found["cls"]
        if not found["eos"] and found["sep"] and tc:
            tc["eos_token"] = found["eos"] = found["sep"]
        post = spec.get("post_processor")
        for proc in post.get("processors", [post]) if post else []:
            kind = proc.get("type")
            if kind == "ByteLevel":
                sv.add.setdefault("bos", False)
                sv.add.setdefault("eos", False)
            elif kind == "RobertaProcessing":
                sv.add.update(bos=True, eos=True, sep=True)
                if not found["cls"] and tc:
                    tc["cls_token"] = found["cls"] = proc.get("cls", [found["bos"]])[0]
                if not found["sep"] and tc:
                    tc["sep_token"] = found["sep"] = proc.get("sep", [found["eos"]])[0]
            elif kind == "TemplateProcessing":
                _template(sv, proc, tc, found)
    if not tc:
        return
    sv.chat_template = _chat_template(root, tc)
    for kind in sv.types:
        flag = tc.get(f"add_{kind}_token")
        if isinstance(flag, bool) and kind not in sv.add:
            sv.add[kind] = flag
        entry = tc.get(f"{kind}_token")
        content = entry.get("content") if isinstance(entry, dict) else entry
        if not isinstance(content, str):
            continue
        sv.set_id(kind, next((t.get("id") for t in added if t.get("content") == content), None))


def _chat_template(root: Path, tc: dict[str, Any]) -> Any:
    alt: Any = None
    jinja, as_json = root / "chat_template.jinja", root / "chat_template.json"
    if jinja.is_file():
        alt = jinja.read_text(encoding="utf-8")
        more = sorted((root / "additional_chat_templates").glob("*.jinja"))
        if more:
            alt = [{"name": "default", "template": alt}] + [
                {"name": p.stem, "template": p.read_text(encoding="utf-8")} for p in more
            ]
    elif as_json.is_file():
        alt = (read_json(as_json) or {}).get("chat_template")
    found = tc.get("chat_template", alt)
    return found if found is None or isinstance(found, str | list) else None


def _template_items(value: Any) -> list[MetaItem]:
    if isinstance(value, str):
        return [MetaItem("tokenizer.chat_template", STRING, value)]
    allowed = set(string.ascii_letters + string.digits)
    default, names, out = None, [], []
    for choice in value:
        name = "".join(c if c in allowed else "_" for c in choice.get("name", ""))
        template = choice.get("template")
        if not name or template is None:
            continue
        if name == "default":
            default = template
        else:
            names.append(name)
            out.append(MetaItem(f"tokenizer.chat_template.{name}", STRING, template))
    if names:
        out.append(MetaItem("tokenizer.chat_templates", ARRAY, names, STRING))
    if default is not None:
        out.append(MetaItem("tokenizer.chat_template", STRING, default))
    return out


def special_items(root: Path, *, n_vocab: int | None, load_merges: bool) -> list[MetaItem]:
    """Merges, special token ids, add-token flags, chat template and normalizer flags of the
    tokenizer in ``root`` (ids not below ``n_vocab`` are left out, as the converter does)."""
    sv = _Special(n_vocab)
    _from_tokenizer_files(sv, root, load_merges)
    config_path = root / "config.json"
    if config_path.is_file():
        config = read_json(config_path)
        for kind in sv.types:
            tid = config.get(f"{kind}_token_id")
            if tid is None and isinstance(config.get("text_config"), dict):
                tid = config["text_config"].get(f"{kind}_token_id")
            sv.set_id(kind, tid)
    if load_merges and not sv.merges and (root / "merges.txt").is_file():
        sv.merges = _merges_txt(root / "merges.txt")
    items: list[MetaItem] = []
    if sv.merges:
        items.append(MetaItem("tokenizer.ggml.merges", ARRAY, sv.merges, STRING))
    items += [MetaItem(ID_KEYS[k], UINT32, v) for k, v in sv.ids.items() if k in ID_KEYS]
    items += [MetaItem(ADD_KEYS[k], BOOL, v) for k, v in sv.add.items() if k in ADD_KEYS]
    if sv.chat_template is not None:
        items += _template_items(sv.chat_template)
    if sv.lowercase is not None:
        items.append(MetaItem("tokenizer.ggml.normalizer.lowercase", BOOL, sv.lowercase))
    if sv.strip_accents is not None:
        items.append(MetaItem("tokenizer.ggml.normalizer.strip_accents", BOOL, sv.strip_accents))
    return items
