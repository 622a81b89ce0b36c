"""A model's chat template, rendered as vLLM renders it, so that a chat request's prompt is
keyed by the same token ids the engine will hash into its prefix-cache blocks.

vLLM renders messages with transformers' ``apply_chat_template``: a sandboxed Jinja
environment with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols`` extension, a
``{% generation %}`` tag, a ``tojson`` filter that does not escape HTML, ``raise_exception``
and ``strftime_now``; the tokenizer's special tokens (``bos_token``, ...) as variables; the
request's ``tools``, ``documents``, ``add_generation_prompt`` and ``chat_template_kwargs``.
Text parts of a message's content are joined with newlines (vLLM's ``string`` content
format); ``developer`` messages become ``system`` ones for a template that does not know
that role. The rendered text is tokenized without special tokens unless the request sets
``add_special_tokens`` (vLLM's default for chat).

Not keyed (``render`` gives None, and the policy then routes that request by load): content
parts other than text (images, audio: the engine inserts placeholders whose ids are its
processor's), templates that iterate over content parts (vLLM's ``openai`` content format),
``continue_final_message``, and a template that raises for the request.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any

from baton.core.errors import ConfigError

SPECIAL = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


class ChatTemplate:
    """A chat template with the special tokens of its tokenizer (see the module docstring)."""

    def __init__(self, source: str, special: dict[str, Any] | None = None, name: str = "chat template") -> None:
        try:
            import jinja2
            import jinja2.ext
            from jinja2.sandbox import ImmutableSandboxedEnvironment
        except ImportError:
            raise ConfigError("chat templates need jinja2: pip install -e '.[tokenizer]'") from None
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _generation_tag(jinja2)])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ConfigError(f"{name}: not a Jinja template: {exc}") from None
        self.source, self.name = source, name
        self.special = {k: v for k, v in (special or {}).items() if v is not None}
        self.knows_developer = "'developer'" in source or '"developer"' in source
        self.iterates_parts = _iterates_content_parts(env, source)

    @classmethod
    def beside(cls, tokenizer: str | Path, template: str | Path | None = None) -> "ChatTemplate | None":
        """The template of the model whose tokenizer is at ``tokenizer`` (its file or folder):
        ``template`` if given, else the folder's ``chat_template.jinja``, else the
        ``chat_template`` of its ``tokenizer_config.json``; None when it has none."""
        folder = Path(tokenizer).expanduser()
        folder = folder if folder.is_dir() else folder.parent
        config = _read_json(folder / "tokenizer_config.json")
        special = {k: _token_text(config.get(k)) for k in SPECIAL}
        if template is not None:
            path = Path(template).expanduser()
            try:
                return cls(path.read_text(encoding="utf-8"), special, str(path))
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(f"chat_template: cannot read {path}: {type(exc).__name__}") from None
        jinja = folder / "chat_template.jinja"
        if jinja.is_file():
            return cls(jinja.read_text(encoding="utf-8"), special, str(jinja))
        source = config.get("chat_template")
        if isinstance(source, list):  # named templates: vLLM takes "default"
            source = next((t.get("template") for t in source if isinstance(t, dict) and t.get("name") == "default"),
                          None)
        return cls(source, special, f"{folder / 'tokenizer_config.json'}: chat_template") \
            if isinstance(source, str) else None

    def render(self, body: dict[str, Any]) -> str | None:
        """The prompt text the engine builds from a chat request's body, or None when Baton
        cannot know it (module docstring)."""
        if body.get("continue_final_message") or self.iterates_parts:
            return None
        messages = [_message(m) for m in body.get("messages") or []]
        if not messages or any(m is None for m in messages):
            return None
        if not self.knows_developer and any(m["role"] == "developer" for m in messages):
            messages = _developer_as_system(messages)
        extra = body.get("chat_template_kwargs") if isinstance(body.get("chat_template_kwargs"), dict) else {}
        try:
            return self._template.render(**self.special, messages=messages, tools=body.get("tools"),
                                         documents=body.get("documents"),
                                         add_generation_prompt=body.get("add_generation_prompt", True), **extra)
        except Exception:  # noqa: BLE001 - a template may raise anything for a request it refuses
            return None


def _message(m: Any) -> dict[str, Any] | None:
    """A message as vLLM hands it to the template (string content), or None if its content
    is not text alone."""
    if not isinstance(m, dict) or not isinstance(m.get("role"), str):
        return None
    content = m.get("content")
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict) and p.get("type") == "text"]
        if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
            return None
        content = "\n".join(texts)
    elif not isinstance(content, str):
        return None
    return {**m, "content": content}


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``developer`` messages as ``system`` ones, every system message merged into one first
    message (blank line between), as vLLM does for a template without that role."""
    systems = [m["content"] for m in messages if m["role"] in ("system", "developer") and m["content"]]
    others = [m for m in messages if m["role"] not in ("system", "developer")]
    return [{"role": "system", "content": "\n\n".join(systems)}, *others]


def _iterates_content_parts(env, source: str) -> bool:
    """Whether the template loops over a message's content (vLLM then hands it the parts,
    not one string): a ``for`` over ``message['content']`` or ``message.content``."""
    import jinja2.nodes as nodes
    try:
        tree = env.parse(source)
    except Exception:  # noqa: BLE001
        return False
    for loop in tree.find_all(nodes.For):
        it = loop.iter
        if isinstance(it, nodes.Getitem) and isinstance(it.arg, nodes.Const) and it.arg.value == "content":
            return True
        if isinstance(it, nodes.Getattr) and it.attr == "content":
            return True
    return False


def _generation_tag(jinja2):
    class Generation(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}``: transformers marks assistant text with
        it; rendering keeps the body as it is."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_keep"), [], [], body).set_lineno(lineno)

        def _keep(self, caller):
            return caller()
    return Generation


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None,
            sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _raise(message: str):
    import jinja2
    raise jinja2.TemplateError(message)


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"tokenizer: {path}: cannot read it: {type(exc).__name__}") from None
    return data if isinstance(data, dict) else {}
