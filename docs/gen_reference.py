"""Generate docs/pages/reference.md and docs/pages/code.md from the code's own declarations.

Nothing on the page is written by hand: the methods and their settings come from the registry
(``profkit.core.methods``: ``METHODS``, ``SETTINGS``), the run settings from ``RunSettings``' declared options
(``profkit.core.settings``), the presets from ``profkit.core.presets``, every command's arguments and options from
the click commands typer builds (``profkit.cli.app``), each as its ``--help`` prints it, and the stack from
``pyproject.toml``. The code's organisation comes from the packages' and modules' docstrings and the layer rules
``tests/test_layers.py`` holds the imports to. ``tests/test_docs.py`` regenerates both pages and fails when a
committed one differs.

    python docs/gen_reference.py          # rewrite the pages
    python docs/gen_reference.py --check  # exit 1 if a committed page is out of date
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "pages" / "reference.md"
CODE_PAGE = ROOT / "docs" / "pages" / "code.md"
PACKAGE = ROOT / "profkit"

APPLIES = {  # Setting.applies, in words
    "lora": "LoRA and QLoRA methods",
    "quantized": "4-bit methods (QLoRA, infer_int4)",
    "train": "training methods",
    "infer": "generation methods",
    "sharded": "ZeRO and FSDP methods",
    "fsdp": "FSDP methods",
    "any": "every method",
}


def _cell(text: object) -> str:
    """Text for one Markdown table cell."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _code(text: object) -> str:
    return f"`{text}`" if str(text) else ""


def _methods() -> list[str]:
    from profkit.core.methods import METHODS

    lines = ["| method | kind | what it does | adapter | 4-bit | checkpointing | ZeRO stage | FSDP |",
             "|---|---|---|---|---|---|---|---|"]
    for m in METHODS.values():
        lines.append(f"| `{m.name}` | {m.kind} | {_cell(m.description)} | {m.adapter} | {m.quantization or '-'} | "
                     f"{'yes' if m.gradient_checkpointing else '-'} | {m.zero_stage or '-'} | "
                     f"{'yes' if m.fsdp else '-'} |")
    return lines


def _method_settings(hidden: bool = False) -> list[str]:
    """The settings --help shows, or (``hidden``) those a stack derives, which an expert may still force."""
    from profkit.core.methods import SETTINGS, Method

    defaults = {f.name: f.default for f in dataclasses.fields(Method)}
    lines = ["| option | applies to | values | registry default | what it sets |", "|---|---|---|---|---|"]
    for setting in SETTINGS.values():
        option = setting.option
        if option.hidden != hidden:
            continue
        flag = f"{option.flag}/--no-{option.flag[2:]}" if option.type is bool else option.flag
        default = defaults.get(setting.field)
        if isinstance(default, tuple):
            default = ",".join(default)
        elif isinstance(default, bool):
            default = "on" if default else "off"
        lines.append(f"| `{flag}` | {APPLIES[setting.applies]} | {_cell(_values(option))} | "
                     f"{_code(default) if default not in (None, '') else 'the method' + chr(39) + 's own'} | "
                     f"{_cell(option.help)} |")
    return lines


def _values(option) -> str:
    if option.choices:
        return ", ".join(option.choices)
    if option.type is bool:
        return "on / off"
    bounds = []
    if option.minimum is not None:
        bounds.append(f">= {option.minimum:g}")
    if option.maximum is not None:
        bounds.append(f"<= {option.maximum:g}")
    return option.type.__name__ + (" " + ", ".join(bounds) if bounds else "")


def _run_settings() -> list[str]:
    from profkit.core.settings import RunSettings

    lines = ["| option | values | default | what it sets |", "|---|---|---|---|"]
    for option, default in RunSettings.options().values():
        lines.append(f"| `{option.flag}` | {_cell(_values(option))} | "
                     f"{_code(default) if default is not None else '-'} | {_cell(option.help)} |")
    return lines


def _presets() -> list[str]:
    from profkit.core.presets import DEFAULT_PRESET, PRESETS

    lines = ["| preset | model | batch | sequence | new tokens |", "|---|---|---:|---:|---:|"]
    for p in PRESETS.values():
        name = f"`{p.name}` (default)" if p.name == DEFAULT_PRESET else f"`{p.name}`"
        lines.append(f"| {name} | {_cell(p.description)} | {p.batch_size} | {p.seq_len} | {p.max_new_tokens} |")
    return lines


def _stack_parts() -> list[str]:
    from profkit.core.stack import PACKAGES

    return [*PACKAGES, "loop", "fsdp"]


def _named_stacks() -> list[str]:
    from profkit.core.stack import presets

    lines = ["| name | parts | what it stands for | read in |", "|---|---|---|---|"]
    for name, entry in presets().items():
        parts = ", ".join(f"{k}={v}" for k, v in entry.items() if k not in ("what", "source"))
        lines.append(f"| `{name}` | {_code(parts)} | {_cell(entry['what'])} | {_cell(entry['source'])} |")
    return lines


def _project() -> dict:
    """pyproject.toml's [project] table (tomllib is Python 3.11's; 3.10 reads the two keys used here)."""
    text = (ROOT / "pyproject.toml").read_text()
    try:
        import tomllib
    except ImportError:
        python = re.search(r'^requires-python\s*=\s*"([^"]+)"', text, re.M).group(1)
        block = re.search(r"^dependencies\s*=\s*\[(.*?)^\]", text, re.M | re.S).group(1)
        return {"requires-python": python, "dependencies": re.findall(r'^\s*"([^"]+)"', block, re.M)}
    return tomllib.loads(text)["project"]


def _stack() -> list[str]:
    project = _project()
    lines = [f"Python {project['requires-python']}.", "", "| package | versions |", "|---|---|"]
    for requirement in project["dependencies"]:
        name = requirement.split(";")[0]
        cut = next((i for i, c in enumerate(name) if c in "<>=!~["), len(name))
        lines.append(f"| {name[:cut].strip()} | `{name[cut:].strip() or 'any'}` |")
    return lines


def commands() -> dict[str, list[tuple[str, str]]]:
    """Each command's help records, (the option or argument as --help names it, its help), in --help's order."""
    import click
    import typer

    from profkit.cli import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="profkit", **(group.context_settings or {}))
    records = {}
    for name, command in (("", group), *group.commands.items()):
        ctx = root if command is group else click.Context(command, info_name=name, parent=root)
        rows = []
        for param in command.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                rows.append((record[0], record[1] or ""))
        records[name] = rows
    return records


def _commands() -> list[str]:
    import click
    import typer

    from profkit.cli import app

    group = typer.main.get_command(app)
    root = click.Context(group, info_name="profkit", **(group.context_settings or {}))
    helps = commands()
    lines = []
    for name, command in (("", group), *group.commands.items()):
        ctx = root if command is group else click.Context(command, info_name=name, parent=root)
        title = " ".join(("profkit", name)).strip()
        lines += [f"### {title}", "", "```text", f"{title} " + " ".join(command.collect_usage_pieces(ctx)), "```",
                  "", _cell(command.help or ""), ""]
        if name:
            lines += [f"Worked examples: [profkit {name}](commands/{name}.md).", ""]
        lines += ["| argument or option | help |", "|---|---|"]
        lines += [f"| `{opts}` | {_cell(help_)} |" for opts, help_ in helps[name]]
        if command.epilog:
            lines += ["", _cell(command.epilog)]
        lines.append("")
    return lines


def render() -> str:
    lines = [
        "# Settings reference",
        "",
        "<!-- Generated by docs/gen_reference.py from the code's declarations; do not edit by hand. "
        "`make docs` rewrites it, tests/test_docs.py fails when it differs. -->",
        "",
        "Generated from the code's own declarations: the method registry (`profkit/core/methods.py`: `METHODS`, "
        "`SETTINGS`), the run settings (`profkit/core/settings.py`: `RunSettings`' options), the presets "
        "(`profkit/core/presets.py`), each command's options as its `--help` prints them (`profkit/cli/`), and the "
        "supported stack (`pyproject.toml`).",
        "",
        "## Methods",
        "",
        "`profkit methods` prints the same registry (`--json` for all of each method's fields).",
        "",
        *_methods(),
        "",
        "## Method settings",
        "",
        "`profkit record` and `profkit estimate` take these on top of the method names. A setting that makes no "
        "sense for a method (a LoRA rank for `full`) exits 2 and says why; one the device cannot run records the "
        "run as `unsupported` with the reason. A run's directory name carries every changed setting "
        "(`lora-r16-all-linear-adamw-8bit`).",
        "",
        *_method_settings(),
        "",
        "## The stack a run uses",
        "",
        "`profkit estimate --stack` and `recommend --stack` name the software a run uses where it is not what is "
        "installed beside profkit: a named stack, `part=value` pairs (`transformers=4.48.1,bitsandbytes=0.43.3,"
        "loop=litgpt`; parts: " + ", ".join(f"`{p}`" for p in _stack_parts()) + "), or both "
        "(`litgpt,transformers=4.40`: the pairs over the named stack). A part not given is the installed "
        "package's; a recorded run's manifest comes first where `recommend` reads runs. Every estimate names the "
        "stack on its first line and in `--format json` under `stack`, each part with where it came from.",
        "",
        *_named_stacks(),
        "",
        "What a stack implies is derived from it in one place (`profkit/predict/mechanisms.py`), each with a note. "
        "The settings below are those mechanisms; `--help` does not show them, but each still forces its "
        "mechanism where the stack does not say enough (an option given wins over the stack):",
        "",
        *_method_settings(hidden=True),
        "",
        "## Run settings",
        "",
        "`profkit record` takes all of these; `estimate` and `recommend` take the workload's (see each command "
        "below). A run's manifest holds the effective values.",
        "",
        *_run_settings(),
        "",
        "## Presets",
        "",
        "Model configurations built with random weights: nothing is downloaded.",
        "",
        *_presets(),
        "",
        "## Supported versions",
        "",
        "The ranges `pyproject.toml` declares (tested together in CI on CPU; the lowest torch by "
        "`analyses/lowest_torch.sh`).",
        "",
        *_stack(),
        "",
        "## Commands",
        "",
        *_commands(),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _docstring(path: Path) -> str:
    import ast

    return (ast.get_docstring(ast.parse(path.read_text())) or "").replace("``", "`")


def _first_sentence(text: str) -> str:
    paragraph = " ".join(text.split("\n\n")[0].split())
    return re.split(r"(?<=\.)\s+(?=[A-Z`(])", paragraph)[0]


def _layers() -> dict[str, list[str]]:
    """tests/test_layers.py's LAYERS (each layer and the layers it may import), read without importing the test."""
    import ast

    tree = ast.parse((ROOT / "tests" / "test_layers.py").read_text())
    node = next(n.value for n in tree.body if isinstance(n, ast.Assign)
                and any(getattr(t, "id", None) == "LAYERS" for t in n.targets))
    return {ast.literal_eval(k): sorted(ast.literal_eval(v)) if not isinstance(v, ast.Call) else []
            for k, v in zip(node.keys, node.values)}


# Where a package or module has no docstring, what it is (say so in its docstring and this goes).
NO_DOCSTRING = {
    "report": "Rendering a Breakdown: findings (every sentence, ranked), the answers, tables, one renderer per "
              "format (JSON, CSV, Markdown; the report; plots; the Perfetto viewer; TensorBoard).",
    "__main__": "`python -m profkit`: the command line.",
}


def _what(name: str, path: Path) -> str:
    text = _first_sentence(_docstring(path))
    if text:
        return text
    if name.endswith("_cmd"):
        return f"`profkit {name.removesuffix('_cmd')}`: its arguments, and the library calls it makes."
    return NO_DOCSTRING.get(name, "")


def render_code() -> str:
    layers = _layers()
    lines = [
        "# How the code is organised",
        "",
        "<!-- Generated by docs/gen_reference.py from the packages' docstrings and tests/test_layers.py; do not edit "
        "by hand. `make docs` rewrites it, tests/test_docs.py fails when it differs. -->",
        "",
        "Packages by layer; each imports only the layers named beside it (`tests/test_layers.py` holds the code to "
        "it: no import cycle, no import inside a function but a heavy or optional dependency's, with its reason).",
        "",
        "| package | what it is | may import |",
        "|---|---|---|",
    ]
    for layer, allowed in layers.items():
        if layer in ("__init__", "__main__"):
            continue
        path = PACKAGE / layer / "__init__.py" if (PACKAGE / layer).is_dir() else PACKAGE / f"{layer}.py"
        name = f"`{layer}/`" if path.name == "__init__.py" else f"`{layer}.py`"
        text = " ".join(_docstring(path).split("\n\n")[0].split()) or NO_DOCSTRING.get(layer, "")
        lines.append(f"| {name} | {_cell(text)} | {', '.join(allowed) or 'nothing of profkit'} |")
    lines += ["", "`profkit/__init__.py` exports the API (`api`); `profkit/__main__.py` runs the command line (`cli`).",
              "", "## Modules", ""]
    for layer in layers:
        folder = PACKAGE / layer
        if not folder.is_dir():
            continue
        lines += [f"### {layer}/", "", "| module | what it is |", "|---|---|"]
        for path in sorted(folder.rglob("*.py")):
            if path.name == "__init__.py" and path.parent == folder:
                continue
            module = path.relative_to(folder).with_suffix("").as_posix().removesuffix("/__init__")
            lines.append(f"| `{module}` | {_cell(_what(path.stem if path.stem != '__init__' else module, path))} |")
        lines.append("")
    lines += [
        "## Around the package",
        "",
        "- `analyses/`: reproducible studies and benchmarks (each script says what it regenerates under "
        "`reports/`).",
        "- `tests/`: mirrors the package; `tests/e2e/` holds what records, trains, installs, runs the command line "
        "in a subprocess or starts a process. `make test-fast` runs the rest (the pure layers on stored fixtures "
        "and the estimate on the meta device); `make test` runs all but the tests marked `long` (the sweep over "
        "the used published figures, and variants whose mechanism another test records end to end); "
        "`make test-all` runs everything.",
        "- `docs/`: this site (`docs/mkdocs.yml`, pages in `docs/pages/`) and `docs/gen_reference.py`, which "
        "writes the [settings reference](reference.md) and this page.",
    ]
    return "\n".join(lines).rstrip() + "\n"


def pages() -> dict[Path, str]:
    return {PAGE: render(), CODE_PAGE: render_code()}


def main(argv: list[str]) -> int:
    stale = 0
    for page, text in pages().items():
        if "--check" in argv:
            if page.read_text() != text:
                print(f"{page.relative_to(ROOT)} is out of date: run `make docs`", file=sys.stderr)
                stale = 1
            continue
        page.write_text(text)
        print(f"wrote {page.relative_to(ROOT)}")
    return stale


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
