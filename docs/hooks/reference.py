"""MkDocs hooks (``hooks:`` in mkdocs.yml): the reference pages are filled from the code at build time,
so they cannot drift from it.

A page asks for generated text with a marker on a line of its own, ``<!-- gen:NAME ARGS -->``:

* ``gen:cli``: every ``archplace`` subcommand's ``--help``, from ``archplace.cli.build_parser``;
* ``gen:python-api``: mkdocstrings directives for every name of ``archplace.api.__all__``, a section per
  module of the package (mkdocstrings renders them from the signatures and docstrings), and
  ``gen:python-client`` the same for ``archplace.client``;
* ``gen:http-api``: the service's routes and request/response schemas, from the FastAPI app's OpenAPI
  (``archplace.service.app.create_app`` over a throw-away SQLite file; nothing is served, no Ray);
* ``gen:presets-accelerators``, ``-gpus``, ``-gpu-machines``, ``-clusters``, ``-models``, ``-gdp``,
  ``-profiled``: tables of the presets in ``archplace.hardware`` and ``archplace.workloads``;
* ``gen:columns TARGET`` (``accelerator``, ``mcm``, ``gpu-cluster``): a search's Parquet columns and
  their Arrow types; ``gen:json-keys``: each command's ``--json`` top-level keys, from the stored
  outputs the suite compares every command with (``tests/golden/cli``).

A hand-written table of columns follows ``<!-- check:columns TARGET -->``: its first column must name
exactly the schema's columns, or the build warns (and ``mkdocs build --strict`` fails).

Every page is checked for development history (issue or session numbers), docstrings included.
``on_config`` also puts every page of ``docs/models/`` into the nav entry ``models/`` (their names are the
cost models', not fixed in mkdocs.yml). Warnings go to the ``mkdocs`` logger, so ``--strict`` counts them.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

log = logging.getLogger("mkdocs.hooks.archplace_reference")

ROOT = Path(__file__).resolve().parents[2]
MARKER = re.compile(r"^<!--\s*(gen|check):([a-z0-9-]+)((?:\s+[^\s>]+)*)\s*-->\s*$", re.M)
HELP_COLUMNS = 100  # argparse wraps help at the terminal width; the page's is fixed


# ---------------------------------------------------------------------- MkDocs events
_openapi_proc = None


def on_config(config, **_):
    """Expand the nav entry ``models/`` (a folder) into that folder's pages, index.md first; start
    computing the OpenAPI (importing the service takes seconds: Ray Tune) beside the rest of the build."""
    global _openapi_proc
    _openapi_proc = subprocess.Popen([sys.executable, __file__, "openapi"], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
    nav = config.get("nav")
    if nav:
        config["nav"] = [_expand(item, Path(config["docs_dir"])) for item in nav]
    return config


def on_post_build(config, **_):
    """A build that never reached the HTTP reference leaves its OpenAPI process: end it."""
    global _openapi_proc
    proc, _openapi_proc = _openapi_proc, None
    if proc is not None:
        proc.kill()
        proc.communicate()


def on_files(files, config, **_):
    """Pages are converted in the order of ``files``: the HTTP reference last, so that the process
    computing its OpenAPI (started by ``on_config``) runs while the other pages are converted."""
    from mkdocs.structure.files import Files

    items = list(files)
    late = [f for f in items if f.src_uri == "reference/http-api.md"]
    return Files([f for f in items if f not in late] + late)


def on_page_markdown(markdown: str, page, config, files, **_):
    def replace(m: re.Match) -> str:
        kind, name, args = m.group(1), m.group(2), m.group(3).split()
        if kind == "check":
            _check(name, args, markdown[m.end():], page.file.src_uri)
            return ""
        fn = GENERATORS.get(name)
        if fn is None:
            log.warning("%s: unknown marker gen:%s (known: %s)", page.file.src_uri, name, sorted(GENERATORS))
            return m.group(0)
        return fn(*args)

    return MARKER.sub(replace, markdown)


HISTORY = re.compile(r"\b(?:issue|session|PR) ?#?\d+\b", re.I)


def on_page_content(html: str, page, config, files, **_):
    """No page tells development history (issue or session numbers), generated text included: the
    docstrings shown by the Python API page come from the code."""
    text = re.sub(r"<[^>]+>", " ", html)
    found = sorted(set(HISTORY.findall(text)))
    if found:
        log.warning("%s: development history in the page (%s); say what is true now instead",
                    page.file.src_uri, ", ".join(found))
    return html


def _expand(item, docs: Path):
    if isinstance(item, dict):
        return {k: _expand(v, docs) for k, v in item.items()}
    if isinstance(item, list):
        return [_expand(v, docs) for v in item]
    if isinstance(item, str) and item.endswith("/") and (docs / item).is_dir():
        pages = sorted((docs / item).glob("*.md"), key=lambda p: (p.name != "index.md", p.name))
        return [f"{item}{p.name}" for p in pages]
    return item


# ---------------------------------------------------------------------- helpers
def _table(header: list[str], rows: list[list]) -> str:
    def cell(v) -> str:   # a pipe ends a cell unless escaped; inside a code span it is literal
        parts = str(v).replace("\n", " ").split("`")
        return "`".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def _num(x: float, unit: str = "", scale: float = 1.0) -> str:
    v = x / scale
    return f"{v:,.0f}{unit}" if v >= 1000 else f"{v:.4g}{unit}"


@contextlib.contextmanager
def _columns(n: int):
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("COLUMNS", None)
        else:
            os.environ["COLUMNS"] = old


# ---------------------------------------------------------------------- the command line
def _subcommands(parser):
    """(name, help, subparser) of ``parser``'s subcommands, in their --help order."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield name, helps.get(name) or "", sub


def gen_cli() -> str:
    from archplace.cli import build_parser

    with _columns(HELP_COLUMNS):
        parser = build_parser()
        rows, sections = [], []

        def walk(p, depth: int) -> None:
            for _name, help_, sub in _subcommands(p):
                rows.append([f"[`{sub.prog}`](#{_anchor(sub.prog)})", help_])
                sections.append(f"{'#' * depth} {sub.prog}\n\n```text\n{sub.format_help().rstrip()}\n```\n")
                walk(sub, min(depth + 1, 6))

        walk(parser, 2)
        top = parser.format_help().rstrip()
    return ("\n" + _table(["command", "what it does"], rows) + "\n## archplace\n\n```text\n" + top
            + "\n```\n\n" + "\n".join(sections))


def _anchor(title: str) -> str:
    """The id MkDocs' toc extension gives a heading of plain words (``archplace serve token``)."""
    return re.sub(r"[^\w\s-]", "", title.lower()).strip().replace(" ", "-")


# ---------------------------------------------------------------------- the HTTP API
def _openapi() -> dict:
    """The OpenAPI of the service, from the process ``on_config`` started (or computed here)."""
    global _openapi_proc
    proc, _openapi_proc = _openapi_proc, None
    if proc is not None:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"computing the service's OpenAPI failed:\n{err}")
        return json.loads(out)
    return _openapi_here()


def _openapi_here() -> dict:
    from archplace.service.app import ServiceState, create_app
    from archplace.service.db import make_engine

    with tempfile.TemporaryDirectory(prefix="archplace-docs-") as d:
        engine = make_engine(str(Path(d) / "openapi.db"))
        try:
            return create_app(ServiceState(engine, auth="none")).openapi()
        finally:
            engine.dispose()


def _ref_name(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _type(s: dict) -> str:
    """A JSON schema in a few words: ``integer``, ``string (sgd | adam)``, ``array of Objective``..."""
    if "$ref" in s:
        name = _ref_name(s["$ref"])
        return f"[{name}](#{name.lower()})"
    if "anyOf" in s:
        parts = [_type(x) for x in s["anyOf"] if x.get("type") != "null"]
        nullable = any(x.get("type") == "null" for x in s["anyOf"])
        return " or ".join(parts) + (" or null" if nullable else "")
    t = s.get("type", "any")
    if "enum" in s:
        return f"{t}: " + ", ".join(f"`{v}`" for v in s["enum"])
    if t == "array":
        return f"array of {_type(s.get('items', {}))}"
    if t == "object" and "additionalProperties" in s and isinstance(s["additionalProperties"], dict):
        return f"object of {_type(s['additionalProperties'])}"
    return t


def _limits(s: dict) -> str:
    for x in s.get("anyOf", []):
        if x.get("type") != "null" and "$ref" not in x:
            s = {**x, **{k: v for k, v in s.items() if k != "anyOf"}}
    out = []
    for key, word in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                      ("exclusiveMaximum", "<"), ("minItems", "items >="), ("maxItems", "items <="),
                      ("maxLength", "length <="), ("pattern", "matches")):
        if key in s and not (key == "maxLength" and s[key] >= 4096):
            v = s[key]
            v = int(v) if isinstance(v, float) and v.is_integer() else v
            out.append(f"{word} `{v}`")
    return ", ".join(out)


def gen_http_api() -> str:
    spec = _openapi()
    rows, routes = [], []
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            title = f"{method.upper()} {path}"
            rows.append([f"[`{title}`](#{_anchor(op['operationId'])})", op.get("summary", "")])
            lines = [f"### `{title}` {{#{_anchor(op['operationId'])}}}", "", op.get("summary", "") + "."]
            if op.get("description"):
                lines += ["", op["description"].strip()]
            params = op.get("parameters", [])
            if params:
                lines += ["", _table(["parameter", "in", "type", "required", "limits", "default"],
                                     [[f"`{p['name']}`", p["in"], _type(p["schema"]),
                                       "yes" if p.get("required") else "no", _limits(p["schema"]),
                                       _default(p["schema"])] for p in params])]
            body = op.get("requestBody", {}).get("content", {}).get("application/json", {}).get("schema")
            if body:
                lines += ["", f"Request body: {_type(body)}."]
            for code, r in op.get("responses", {}).items():
                if code == "422":
                    continue
                schema = r.get("content", {}).get("application/json", {}).get("schema")
                lines += ["", f"Response {code}: " + (_type(schema) if schema else r.get("description", ""))
                          + "."]
            routes.append("\n".join(lines) + "\n")
    schemas = []
    for name, s in spec["components"]["schemas"].items():
        if name in ("HTTPValidationError", "ValidationError"):
            continue
        text = [f"### {name}", ""]
        if s.get("description"):
            text += [s["description"].strip().replace("``", "`"), ""]
        props = s.get("properties", {})
        required = set(s.get("required", []))
        if props:
            text.append(_table(["field", "type", "required", "limits", "default", "meaning"],
                               [[f"`{k}`", _type(v), "yes" if k in required else "no", _limits(v),
                                 _default(v), v.get("description", "")] for k, v in props.items()]))
        schemas.append("\n".join(text) + "\n")
    return ("\n" + _table(["route", "what it does"], rows) + "\n## Routes\n\n" + "\n".join(routes)
            + "\n## Schemas\n\n" + "\n".join(schemas))


def _default(s: dict) -> str:
    return f"`{json.dumps(s['default'])}`" if "default" in s else ""


# ---------------------------------------------------------------------- the Python API
API_ORDER = ("graphs", "gpu_estimate", "placement", "searching", "operator_placement", "partitioning",
             "pipelining", "sharding", "profiling", "_common")


def gen_python_api() -> str:
    """mkdocstrings directives for every name in ``archplace.api.__all__``, one section per module of
    the package (its docstring first), so a name added to the API appears without editing the page.
    Request and result dataclasses show their fields in the signature, not one entry per field."""
    import dataclasses
    import importlib
    import inspect

    import archplace.api as api

    where: dict[str, list[str]] = {}
    sources: dict[str, str] = {}
    for name in api.__all__:
        obj = getattr(api, name)
        mod = getattr(obj, "__module__", None) if (inspect.isclass(obj) or inspect.isfunction(obj)) else None
        if mod is None or not mod.startswith("archplace.api."):   # a constant: the module that assigns it
            for sub in sorted(m for m in _api_modules()):
                text = sources.setdefault(sub, inspect.getsource(importlib.import_module(sub)))
                if re.search(rf"^{re.escape(name)}\b[^=\n]*=", text, re.M):
                    mod = sub
                    break
        where.setdefault((mod or "archplace.api._common").rsplit(".", 1)[1], []).append(name)
    order = [m for m in API_ORDER if m in where] + sorted(set(where) - set(API_ORDER))
    out = []
    for short in order:
        module = importlib.import_module(f"archplace.api.{short}")
        first = (module.__doc__ or short).strip().split("\n")[0]
        title = re.split(r" \(``|: ", first)[0].rstrip(".").replace("``", "`")
        if short == "_common":
            title = "What every call shares"
        out += [f"## {title}", ""]
        if short != "_common":
            out += [f"::: archplace.api.{short}", "    options:", "      show_root_heading: false",
                    "      show_root_toc_entry: false", "      members: false", ""]
        names = where[short]
        # functions first, then the requests and results, then constants
        names.sort(key=lambda n: (not inspect.isfunction(getattr(api, n)),
                                  not inspect.isclass(getattr(api, n)), api.__all__.index(n)))
        for name in names:
            obj = getattr(api, name)
            out += [f"::: archplace.api.{name}", "    options:", "      heading_level: 3"]
            if dataclasses.is_dataclass(obj):
                out.append("      members: false")
            out.append("")
    return "\n".join(out) + "\n"


def gen_python_client() -> str:
    """The client's module docstring (its example), ``Client`` with its methods (its attributes are
    the constructor's arguments, in the signature already) and ``ServiceError``."""
    import inspect

    from archplace.client import Client

    methods = [n for n, _ in inspect.getmembers(Client, inspect.isfunction) if not n.startswith("_")]
    methods.sort(key=lambda n: Client.__dict__[n].__code__.co_firstlineno if n in Client.__dict__ else 0)
    return "\n".join(["::: archplace.client", "    options:", "      show_root_heading: false",
                      "      show_root_toc_entry: false", "      members: false", "",
                      "::: archplace.client.Client", "    options:", "      heading_level: 3",
                      f"      members: [{', '.join(methods)}]", "",
                      "::: archplace.client.ServiceError", "    options:", "      heading_level: 3", ""])


def _api_modules() -> list[str]:
    import pkgutil

    import archplace.api as api

    return [f"archplace.api.{m.name}" for m in pkgutil.iter_modules(api.__path__)]


# ---------------------------------------------------------------------- presets
def gen_presets_accelerators() -> str:
    from archplace.hardware import presets
    from archplace.hardware.area import accelerator_area_mm2

    table = getattr(presets, "ACCELERATORS", None) or presets._ACCELERATORS
    rows = [[f"`{name}`", a.num_tc, a.num_vc, f"{a.pe_x}×{a.pe_y}", a.pe_vc, _num(a.glb_mb, " MB"),
             _num(a.hbm_gb, " GiB"), _num(a.hbm_bw, " GB/s", 1e9), _num(a.clock_hz, " MHz", 1e6),
             _num(a.peak_flops, " TFLOP/s", 1e12), f"{accelerator_area_mm2(a):,.0f}"]
            for name, a in table.items()]
    return _table(["name", "tensor cores", "vector cores", "PE array", "vector width", "GLB", "HBM",
                   "HBM bandwidth", "clock", "peak", "area (mm²)"], rows)


def gen_presets_gpus() -> str:
    from archplace.hardware.gpus import GPUS

    rows = [[f"`{g.name}`", g.label, _num(g.peak("bf16"), "", 1e12), _num(g.peak("tf32"), "", 1e12),
             _num(g.peak("fp32"), "", 1e12), _num(g.memory_bytes, " GiB", 2**30),
             _num(g.hbm_bytes_per_s, " GB/s", 1e9),
             _num(g.nvlink_bytes_per_s, " GB/s", 1e9) if g.nvlink_bytes_per_s else "none",
             _num(g.pcie_bytes_per_s, " GB/s", 1e9), _num(g.ib_bytes_per_s, " GB/s", 1e9), g.source]
            for g in GPUS.values()]
    return _table(["name", "GPU", "bf16/fp16 TFLOP/s", "tf32 TFLOP/s", "fp32 TFLOP/s", "memory", "HBM",
                   "NVLink (per direction)", "PCIe", "InfiniBand per GPU", "source"], rows)


def gen_presets_gpu_machines() -> str:
    from archplace.hardware.gpu_machines import GPU_MACHINES

    rows = [[f"`{m.name}`", f"`{m.gpu}`", m.num_devices, _num(m.memory_bytes, " GiB", 2**30), m.interconnect,
             _num(m.link_bytes_per_s, " GB/s", 1e9), _num(m.link_latency_s, " µs", 1e-6), m.dtype]
            for m in GPU_MACHINES.values()]
    return _table(["name", "GPU", "GPUs (default)", "memory per GPU", "interconnect", "link", "per transfer",
                   "dtype"], rows)


def gen_presets_clusters() -> str:
    from archplace.hardware import presets

    rows = []
    for name in ("v100-server-A", "v100-server-B", "v100-server-C", "mcm-36", "flat"):
        c = presets.preset_cluster(name)
        dev = getattr(c.device, "name", "") or getattr(c.device, "label", lambda: "")()
        between = (f"{_num(c.inter_server_bw, ' GB/s', 1e9)} between servers of {c.devices_per_server}"
                   if c.topology == "servers" else "")
        rows.append([f"`{name}`" + (" (`flat-K`: K devices)" if name == "flat" else ""), c.num_devices,
                     f"`{dev}`", c.topology, _num(c.link_bw, " GB/s", 1e9), between])
    return _table(["name", "devices", "device", "topology", "link", "between servers"], rows)


def gen_presets_models() -> str:
    from archplace.workloads.models import EXPERT_STRATEGIES, PRESETS

    rows = [[f"`{p.name}`", p.family, p.model_class, p.seq_len, sum(p.depths.values()),
             ", ".join(map(str, p.tmp_widths)),
             "{{p={}, d={}, t={}}}".format(*EXPERT_STRATEGIES[p.name]) if p.name in EXPERT_STRATEGIES else "",
             p.source] for p in PRESETS.values()]
    return _table(["name", "family", "transformers class", "sequence", "blocks", "TMP widths",
                   "expert placement (1,024 accelerators)", "source"], rows)


def gen_presets_gdp() -> str:
    # the preset table alone: the package around it imports torch (seconds) to build the graphs
    import importlib.util

    path = ROOT / "archplace" / "workloads" / "gdp_models" / "presets.py"
    spec = importlib.util.spec_from_file_location("_archplace_docs_gdp_presets", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module   # dataclasses look their module up while the classes are made
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    GDP_PRESETS = module.GDP_PRESETS
    rows = [[f"`{p.name}`", p.family, p.devices, p.batch_examples, p.source] for p in GDP_PRESETS.values()]
    return _table(["name", "family", "GPUs (GDP Table 1)", "batch", "architecture"], rows)


def gen_presets_profiled() -> str:
    from archplace.workloads.dnn_partitioning import bundled_graphs

    rows = []
    for name, path in bundled_graphs().items():
        if "/" in name:
            continue
        data = json.loads(path.read_text())
        rows.append([f"`{name}`", path.parent.name, len(data.get("nodes", [])), len(data.get("edges", [])),
                     data.get("maxFPGAs", ""), data.get("maxCPUs", "")])
    return _table(["name", "folder", "nodes", "edges", "accelerators (maxFPGAs)", "CPUs (maxCPUs)"], rows)


# ---------------------------------------------------------------------- result files
def _schema(target: str):
    if target == "accelerator":
        from archplace.platform.store import SCHEMA

        return SCHEMA
    from archplace.platform.codesign import TARGET_INFO

    return TARGET_INFO[target].schema


def gen_columns(target: str = "accelerator") -> str:
    return ", ".join(f"`{f.name}` ({f.type})" for f in _schema(target)) + "\n"


def _check(name: str, args: list[str], rest: str, page: str) -> None:
    if name != "columns":
        log.warning("%s: unknown marker check:%s", page, name)
        return
    target = args[0] if args else "accelerator"
    rows = []
    for line in rest.lstrip("\n").splitlines():
        if not line.startswith("|"):
            break
        rows.append(line)
    named = [re.sub(r"[`\s]", "", r.split("|")[1]) for r in rows[2:]]
    names = {n for cell in named for n in cell.split(",") if n}
    want = {f.name for f in _schema(target)}
    if names != want:
        log.warning("%s: the table of %s columns does not match the code: missing %s, not in the code %s",
                    page, target, sorted(want - names), sorted(names - want))


def gen_json_keys() -> str:
    rows = []
    for path in sorted((ROOT / "tests" / "golden" / "cli").glob("*.json")):
        data = json.loads(path.read_text())
        if isinstance(data, dict):
            rows.append([f"`{path.stem}`", ", ".join(f"`{k}`" for k in sorted(data))])
    return _table(["output", "top-level keys"], rows)


GENERATORS = {
    "cli": gen_cli,
    "python-api": gen_python_api,
    "python-client": gen_python_client,
    "http-api": gen_http_api,
    "presets-accelerators": gen_presets_accelerators,
    "presets-gpus": gen_presets_gpus,
    "presets-gpu-machines": gen_presets_gpu_machines,
    "presets-clusters": gen_presets_clusters,
    "presets-models": gen_presets_models,
    "presets-gdp": gen_presets_gdp,
    "presets-profiled": gen_presets_profiled,
    "columns": gen_columns,
    "json-keys": gen_json_keys,
}


if __name__ == "__main__" and sys.argv[1:] == ["openapi"]:
    json.dump(_openapi_here(), sys.stdout)
