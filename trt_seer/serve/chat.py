"""The checkpoint's chat template (from the tokenizer files copied beside the artifact), rendered as
transformers' `apply_chat_template` renders it: a sandboxed Jinja environment, `messages`,
`add_generation_prompt`, the special tokens by name, and `raise_exception`.

    template = ChatTemplate.from_directory(Path("engines/my-llama.tokenizer"))   # None: no template
    text = template.render([{"role": "user", "content": "Hi"}])
"""
from __future__ import annotations

import json
from pathlib import Path

from trt_seer.errors import InputError


def _token(value) -> str:
    """A special token as tokenizer_config.json gives it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return str(value.get("content", ""))
    return "" if value is None else str(value)


def template_source(directory: Path) -> tuple[str | None, dict]:
    """(the Jinja source or None, tokenizer_config.json's settings) of a tokenizer directory:
    chat_template.jinja, chat_template.json, or tokenizer_config.json's `chat_template` (the default
    of a list of named templates)."""
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.is_file() else {}
    if (directory / "chat_template.jinja").is_file():
        return (directory / "chat_template.jinja").read_text(), config
    if (directory / "chat_template.json").is_file():
        return json.loads((directory / "chat_template.json").read_text()).get("chat_template"), config
    source = config.get("chat_template")
    if isinstance(source, list):  # [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    return source if isinstance(source, str) else None, config


class ChatTemplate:
    """A compiled chat template and the special tokens it may name."""

    def __init__(self, source: str, config: dict):
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
        env.globals["raise_exception"] = raise_exception
        env.filters.setdefault("tojson", lambda x, **kw: json.dumps(x, ensure_ascii=False, **kw))
        try:
            self.template = env.from_string(source)
        except TemplateError as e:
            raise InputError(f"the checkpoint's chat template does not compile: {e}") from e
        self.tokens = {k: _token(config.get(k)) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}

    @classmethod
    def from_directory(cls, directory: Path) -> "ChatTemplate | None":
        source, config = template_source(Path(directory))
        return None if source is None else cls(source, config)

    def render(self, messages: list[dict]) -> str:
        """The prompt text; InputError where the template rejects the conversation."""
        from jinja2.exceptions import TemplateError

        try:
            return self.template.render(messages=messages, add_generation_prompt=True, **self.tokens)
        except TemplateError as e:
            raise InputError(f"the chat template rejected these messages: {e}") from e
