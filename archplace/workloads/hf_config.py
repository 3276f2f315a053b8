"""Model references of ``transformers`` configs: ``hf:/abs/path/config.json`` (:func:`hf_ref`), the
model class a config names, the model built on the meta device, and :class:`HfModel`, which gives the
graph builders what a preset gives them (stacks, example inputs, TMP roles).

The lowest floor of bring-your-own-model: ``models.preset`` resolves a reference through
:func:`hf_model`, and ``byom`` (``from_hf_config``, ``from_module``) builds graphs above both. It
imports nothing of ``models`` or ``byom``, so the three form no circle."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import logging
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HF_PREFIX = "hf:"
_ALLOW_SUFFIX = "?allow-unmapped-ops"
# config fields that set a block stack's depth (transformers' names across families)
_DEPTH_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
               "decoder_layers", "encoder_layers", "num_encoder_layers")
_TMP_CANDIDATES = (1, 2, 4, 8)
_DEFAULT_MAX_SEQ = 2048  # default sequence: the config's maximum positions, at most this
_DROP_KEYS = ("model_type", "architectures", "transformers_version", "attn_implementation",
              "_attn_implementation", "experts_implementation", "auto_map")
# What a config file leaves out, transformers fills with its class's defaults (a GPT-2's 12 heads for a
# model of 64): the fields a model's size and cost cannot be guessed without are refused when missing,
# the others listed in one note. Each: the standard name, then other spellings families use (a class's
# own spelling comes from its attribute_map). A field the class does not have (a Mamba's heads) is not
# asked for.
REQUIRED_FIELDS: dict[str, tuple[str, ...]] = {
    "hidden_size": ("d_model", "n_embd", "n_embed", "dim", "embed_dim", "hidden_dim", "model_dim", "width"),
    "num_attention_heads": ("n_head", "n_heads", "num_heads", "encoder_attention_heads",
                            "decoder_attention_heads", "n_attention_heads"),
    "num_hidden_layers": _DEPTH_KEYS + ("n_layers", "num_decoder_layers"),
}
DEFAULTED_FIELDS: dict[str, tuple[str, ...]] = {
    "num_key_value_heads": ("num_kv_heads", "n_head_kv", "multi_query", "num_key_value_groups"),
    "intermediate_size": ("n_inner", "d_ff", "ffn_dim", "ffn_hidden_size", "encoder_ffn_dim",
                          "decoder_ffn_dim", "intermediate_dim", "mlp_dim"),
    "vocab_size": ("padded_vocab_size",),
    "max_position_embeddings": ("n_positions", "n_ctx", "max_seq_len", "seq_length", "context_length",
                                "max_sequence_length"),
    "num_local_experts": ("num_experts", "n_routed_experts", "moe_num_experts"),
    "num_experts_per_tok": ("moe_top_k", "top_k", "num_experts_per_token"),
}
_status = logging.getLogger("archplace.status")   # phases and notes (the CLI prints them: cli/status.py)


# ---------------------------------------------------------------------- references
def hf_ref(path: str | Path, allow_unmapped_ops: bool = False) -> str:
    """The model reference of a config file, as ``build_graph`` and the CLI take it:
    ``hf:/abs/path/config.json`` (with ``?allow-unmapped-ops`` when unmapped ops are accepted)."""
    p = Path(path).expanduser()
    if p.is_dir():
        p = p / "config.json"
    if not p.is_file():
        raise ValueError(f"hf-config {str(path)!r} does not exist (give a transformers config.json or "
                         "the directory holding one)")
    return f"{HF_PREFIX}{p.resolve()}{_ALLOW_SUFFIX if allow_unmapped_ops else ''}"


def is_hf_ref(name: Any) -> bool:
    return isinstance(name, str) and name.startswith(HF_PREFIX)


def _parse_ref(ref: str) -> tuple[Path, bool]:
    body = ref[len(HF_PREFIX):]
    allow = body.endswith(_ALLOW_SUFFIX)
    if allow:
        body = body[:-len(_ALLOW_SUFFIX)]
    p = Path(body)
    if not p.is_file():
        raise ValueError(f"model {ref!r}: config file {body!r} does not exist")
    return p, allow


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        d = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"hf-config {str(path)!r} cannot be read: {e}") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"hf-config {str(path)!r} is not valid JSON: {e}") from None
    if not isinstance(d, dict):
        raise ValueError(f"hf-config {str(path)!r} must hold a JSON object (a transformers config), "
                         f"got {type(d).__name__}")
    return d


# ---------------------------------------------------------------------- config -> model
def resolve_model_class(d: Mapping[str, Any]) -> type:
    """The ``transformers`` class of a config dict: ``architectures[0]``, else the causal-LM class of
    its ``model_type``, else its base model class."""
    import transformers
    from transformers.models.auto import modeling_auto

    archs = d.get("architectures") or []
    if archs:
        name = archs[0]
        cls = getattr(transformers, str(name), None) if isinstance(name, str) else None
        if cls is None or not hasattr(cls, "config_class"):
            raise ValueError(f"hf-config field 'architectures': {name!r} is not a model class of "
                             f"transformers {transformers.__version__}")
        return cls
    mt = d.get("model_type")
    if not isinstance(mt, str) or not mt:
        raise ValueError("hf-config needs 'architectures' (a transformers model class) or 'model_type'; "
                         "it has neither")
    for mapping in (modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES, modeling_auto.MODEL_MAPPING_NAMES):
        name = mapping.get(mt)
        if isinstance(name, (list, tuple)):
            name = name[0]
        if name and hasattr(transformers, name):
            return getattr(transformers, name)
    raise ValueError(f"hf-config field 'model_type': {mt!r} is not a model type of transformers "
                     f"{transformers.__version__} (allowed: the keys of transformers' "
                     "MODEL_MAPPING_NAMES, e.g. llama, mistral, gpt_neox, vit)")


def make_config(d: Mapping[str, Any], cls: type, **overrides: Any):
    """The config object of ``cls`` from the dict, with eager attention (two GEMMs and a softmax per
    head, never a fused SDPA op) and ``overrides`` (depths) applied; list fields with one entry per
    layer (``layer_types``) are cut to a reduced depth."""
    kw = {k: v for k, v in d.items() if k not in _DROP_KEYS}
    kw["use_cache"] = False  # a capture is one training forward: no KV cache in the outputs
    for key, new in overrides.items():
        old = kw.get(key)
        for k, v in list(kw.items()):
            if isinstance(v, list) and isinstance(old, int) and len(v) == old and new < old:
                kw[k] = v[:new]
        kw[key] = new
    try:
        return cls.config_class(**kw, attn_implementation="eager")
    except Exception as e:  # noqa: BLE001 - TypeError, ValueError, a strict dataclass's validation error
        raise ValueError(f"hf-config does not make a {cls.config_class.__name__}: "
                         f"{' '.join(str(e).split())[:300]}") from None


def _given(d: Mapping[str, Any], std: str, aliases: tuple[str, ...], amap: Mapping[str, str]) -> bool:
    return any(k in d for k in (std, amap.get(std, std), *aliases))


def check_fields(d: Mapping[str, Any], cls: type, cfg, name: str = "config.json") -> list[str]:
    """The fields of :data:`REQUIRED_FIELDS` that the class has and ``d`` lacks are a one-line
    ValueError; those of :data:`DEFAULTED_FIELDS` it lacks are returned as ``field=value`` (the value
    transformers took: its default, or what the class derives from the other fields)."""
    amap = getattr(cls.config_class, "attribute_map", None) or {}

    def has(std: str) -> bool:
        try:
            return getattr(cfg, std, None) is not None
        except Exception:  # noqa: BLE001 - a property that raises on a partial config: not asked for
            return False

    missing = [std for std, aliases in REQUIRED_FIELDS.items()
               if has(std) and not _given(d, std, aliases, amap)]
    if missing:
        spelled = [f"{std} ({amap[std]})" if amap.get(std, std) != std else std for std in missing]
        defaults = ", ".join(f"{getattr(cfg, std)}" for std in missing)
        it = "it" if len(missing) == 1 else "them"
        raise ValueError(f"hf-config {name} lacks {', '.join(spelled)}: {cls.__name__}'s size cannot be "
                         f"known without {it} (transformers would take its default"
                         f"{'s' if len(missing) > 1 else ''}, {defaults}, silently); add {it} to the file")
    return [f"{std}={getattr(cfg, std)}" for std, aliases in DEFAULTED_FIELDS.items()
            if has(std) and not _given(d, std, aliases, amap)]


def build_meta_model(cls: type, config):
    import torch

    try:
        with torch.device("meta"):
            model = cls(config)
    except Exception as e:  # noqa: BLE001 - any failure of a user's config is one line, not a traceback
        raise ValueError(f"hf-config: building {cls.__name__} on the meta device failed: "
                         f"{type(e).__name__}: {_first_line(e)}") from e
    _params_to_meta(model)
    model.eval()  # dropout stays in the graph (aten.dropout with train=False is still captured)
    return model


def _params_to_meta(model) -> None:
    """Parameters a legacy constructor made on the CPU despite the meta device (XLNet's
    ``torch.FloatTensor(...)`` attention weights) move to the meta device, tied ones together."""
    import torch.nn as nn

    moved: dict[int, nn.Parameter] = {}
    for mod in model.modules():
        for name, p in list(mod._parameters.items()):
            if p is not None and not p.is_meta:
                if id(p) not in moved:
                    moved[id(p)] = nn.Parameter(p.detach().to("meta"), requires_grad=p.requires_grad)
                mod._parameters[name] = moved[id(p)]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:300]


def find_layer_stacks(module, depths: Iterable[int] = ()) -> list[tuple[str, int]]:
    """The block stacks of a module tree: each outermost ``nn.ModuleList`` whose children hold
    parameters and are all of one class, or, when its length is one of the config's ``depths``, of
    several classes (a hybrid stack: Jamba's and Zamba's Mamba and attention layers), as (path,
    length), in module order."""
    import torch.nn as nn

    depths = set(depths)
    found: list[tuple[str, int]] = []
    for name, mod in module.named_modules():
        if not name or not isinstance(mod, nn.ModuleList) or len(mod) == 0:
            continue
        if any(name.startswith(f + ".") for f, _ in found):
            continue  # inside a block of an outer stack (experts of an MoE layer)
        one_class = len({type(c) for c in mod}) == 1
        if (one_class or len(mod) in depths) and next(mod.parameters(), None) is not None:
            found.append((name, len(mod)))
    return found


def attention_heads(cfg) -> dict[str, int]:
    """The query and KV heads of a ``transformers`` config ({} when it names none): what a
    tensor-parallel width must divide. KV heads: ``num_key_value_heads`` (GQA), ``num_kv_heads``, one
    for a multi-query model, else the query heads."""
    if getattr(cfg, "is_heterogeneous", False) is True:  # per-layer configs: a width divides every layer's
        import math

        per = [h for h in (attention_heads(c) for c in cfg.per_layer_config) if h]
        return {k: math.gcd(*(h[k] for h in per)) for k in ("num_attention_heads", "num_key_value_heads")} \
            if per else {}
    heads = getattr(cfg, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        return {}
    kv = getattr(cfg, "num_key_value_heads", None) or getattr(cfg, "num_kv_heads", None)
    if not isinstance(kv, int) or kv < 1:
        kv = 1 if getattr(cfg, "multi_query", False) is True else heads
    return {"num_attention_heads": heads, "num_key_value_heads": kv}


# ---------------------------------------------------------------------- the model behind hf:PATH
@dataclass(frozen=True)
class HfModel:
    """What ``models.preset`` returns for an ``hf:`` reference: the fields of a ``ModelPreset`` that
    the graph builders, ``place`` and ``search`` use, for a config file."""

    name: str                         # the reference, hf:/abs/path/config.json
    family: str                       # the config's model_type (keys the tensor-parallel role table)
    model_class: str
    seq_len: int                      # default sequence (tokens; a vision model's patches + 1)
    tmp_widths: tuple[int, ...]
    source: str
    stacks: dict[str, int]            # block stack path -> depth in the full model
    depth_keys: dict[str, int]        # config fields reduced for capture -> full value
    num_parameters: int               # transformers' count for the full model
    main_input: str                   # input_ids or pixel_values
    allow_unmapped_ops: bool
    fingerprint: str                  # hash of the config file's content (graph caches key on it)
    config_dict: dict[str, Any]

    @property
    def depths(self) -> dict[str, int]:
        """Config depth fields -> full depth (``ModelPreset.depths``)."""
        return dict(self.depth_keys)

    @property
    def has_loss(self) -> bool:
        return "For" in self.model_class  # a head (LM, classification): cross-entropy over its logits

    @property
    def roles(self) -> dict[str, str] | None:
        from .tp_roles import role_table

        return role_table(self.family)

    def _cls(self) -> type:
        import transformers

        return getattr(transformers, self.model_class)

    def make_config(self, **overrides: Any):
        return make_config(self.config_dict, self._cls(), **overrides)

    @property
    def max_positions(self) -> int | None:
        """``ModelPreset.max_positions``: the config's ``n_positions`` or ``max_position_embeddings``."""
        cfg = self.make_config()
        return getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)

    def build_model(self, capture_blocks: int | None = None):
        """The model on the meta device; with ``capture_blocks``, every stack deeper than that is
        built that deep."""
        over = {} if capture_blocks is None else {k: min(v, capture_blocks)
                                                 for k, v in self.depth_keys.items()}
        return build_meta_model(self._cls(), self.make_config(**over))

    def example_inputs(self, seq: int, mbs: int) -> tuple[tuple, dict[str, Any]]:
        import torch

        cfg = self.make_config()
        if self.main_input == "pixel_values":
            if seq != self.seq_len:
                raise ValueError(f"seq: {self.model_class} sees {self.seq_len} tokens (patches + 1) of "
                                 f"{cfg.image_size}-pixel images; it cannot be set (got {seq})")
            size = int(cfg.image_size)
            return (torch.zeros((mbs, int(cfg.num_channels), size, size), device="meta"),), {}
        ids = torch.zeros((mbs, seq), dtype=torch.long, device="meta")
        kwargs: dict[str, Any] = {}
        if getattr(cfg, "is_encoder_decoder", False):
            kwargs["decoder_input_ids"] = ids
        if "use_cache" in inspect.signature(self._cls().forward).parameters:
            kwargs["use_cache"] = False
        return (ids,), kwargs


def _vision_tokens(cfg) -> int | None:
    size, patch = getattr(cfg, "image_size", None), getattr(cfg, "patch_size", None)
    if isinstance(size, int) and isinstance(patch, int) and patch > 0:
        return (size // patch) ** 2 + 1
    return None


def hf_model(ref: str) -> HfModel:
    """Resolve ``hf:PATH[?allow-unmapped-ops]`` (reads the file; cached by its content)."""
    path, allow = _parse_ref(ref)
    text = path.read_bytes()
    return _hf_model(ref, str(path), allow, hashlib.sha256(text).hexdigest()[:16])


@functools.lru_cache(maxsize=32)
def _hf_model(ref: str, path: str, allow: bool, fingerprint: str) -> HfModel:
    name = Path(path).name
    _status.info(f"reading {name}" + ("" if "transformers" in sys.modules else
                                      " (importing torch and transformers)"))
    import transformers

    from .tp_roles import TP_ROLES

    d = read_config_file(Path(path))
    cls = resolve_model_class(d)
    cfg = make_config(d, cls)
    defaulted = check_fields(d, cls, cfg, name)
    if defaulted:   # one line, once per file and process (this cache)
        fields = [f.split("=", 1) for f in defaulted]
        _status.warning(f"note: {name} lacks {', '.join(k for k, _ in fields)}"
                        f"{',' if len(fields) == 1 else ';'} using "
                        f"{', '.join(v for _, v in fields)} (transformers' "
                        f"default{'s' if len(fields) > 1 else ''})")
    model = build_meta_model(cls, cfg)
    main_input = getattr(model, "main_input_name", "input_ids")
    if main_input not in ("input_ids", "pixel_values"):
        raise ValueError(f"hf-config: {cls.__name__} takes {main_input!r}; --hf-config models take "
                         "input_ids or pixel_values (use archplace.api.from_module with your own inputs)")
    cfg_dict = cfg.to_dict()
    stacks = dict(find_layer_stacks(model, [v for k in _DEPTH_KEYS if isinstance(v := cfg_dict.get(k), int)]))
    depths = {k: cfg_dict[k] for k in _DEPTH_KEYS
              if isinstance(cfg_dict.get(k), int) and cfg_dict[k] in stacks.values()}
    if main_input == "pixel_values":
        seq = _vision_tokens(cfg)
        if seq is None:
            raise ValueError(f"hf-config: {cls.__name__} takes images but the config has no "
                             "image_size / patch_size")
    else:
        max_pos = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
        # a config without a positive maximum (XLNet's -1: relative positions only) gets 512
        seq = min(int(max_pos), _DEFAULT_MAX_SEQ) if isinstance(max_pos, int) and max_pos > 0 else 512
    widths: tuple[int, ...] = (1,)
    if cfg.model_type in TP_ROLES:
        heads = attention_heads(cfg)
        ffn = getattr(cfg, "intermediate_size", None)
        widths = tuple(t for t in _TMP_CANDIDATES if all(v % t == 0 for v in heads.values())
                       and (not isinstance(ffn, int) or ffn % t == 0))
    return HfModel(name=ref, family=cfg.model_type, model_class=cls.__name__, seq_len=int(seq),
                   tmp_widths=widths, source=f"transformers {transformers.__version__} {cls.__name__} "
                   f"from {path}", stacks=stacks, depth_keys=depths,
                   num_parameters=int(model.num_parameters()), main_input=main_input,
                   allow_unmapped_ops=allow, fingerprint=fingerprint, config_dict=d)
