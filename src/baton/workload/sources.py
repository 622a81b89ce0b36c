"""Where the public traces Baton's reproductions and benchmarks read come from: a missing
trace's error names its source and upstream file, and ``--traces DIR`` finds a trace in a
folder under Baton's name or the upstream one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["PUBLIC_TRACES", "PublicTrace", "in_folder", "missing_trace"]


@dataclass(frozen=True, slots=True)
class PublicTrace:
    """One public trace: Baton's file name for it and where to download it."""

    file: str
    title: str
    upstream_file: str
    url: str
    licence: str


PUBLIC_TRACES = {t.file: t for t in (
    PublicTrace("azure_code_2023.csv", "Azure LLM inference trace 2023, coding service",
                "AzureLLMInferenceTrace_code.csv",
                "https://github.com/Azure/AzurePublicDataset/blob/master/data/AzureLLMInferenceTrace_code.csv",
                "CC-BY 4.0"),
    PublicTrace("azure_conv_2023.csv", "Azure LLM inference trace 2023, conversation service",
                "AzureLLMInferenceTrace_conv.csv",
                "https://github.com/Azure/AzurePublicDataset/blob/master/data/AzureLLMInferenceTrace_conv.csv",
                "CC-BY 4.0"),
    PublicTrace("mooncake_conversation.jsonl", "Mooncake (FAST'25) conversation trace, Kimi service",
                "conversation_trace.jsonl",
                "https://github.com/kvcache-ai/Mooncake/blob/main/FAST25-release/traces/conversation_trace.jsonl",
                "see the Mooncake repository"),
)}
_BY_UPSTREAM = {t.upstream_file: t for t in PUBLIC_TRACES.values()}


def _known(path: Path) -> PublicTrace | None:
    return PUBLIC_TRACES.get(path.name) or _BY_UPSTREAM.get(path.name)


def missing_trace(path: Path) -> str:
    """The error for a trace file that is not there: for a public trace, where to get it."""
    trace = _known(path)
    if trace is None:
        return f"{path}: no such trace file"
    return (f"{path}: no such trace file; it is the {trace.title} ({trace.licence}): download "
            f"{trace.upstream_file} from {trace.url} and save it as {path}, or pass --traces DIR with the "
            f"folder that holds it (under either name)")


def in_folder(path: str | Path, folder: str | Path) -> str:
    """``path``'s trace looked up in ``folder`` instead: under the same file name, or, for a
    public trace, under its upstream name (the folder a user downloaded into). A file that
    is in neither place keeps the folder's own name so the error points there."""
    path, folder = Path(path), Path(folder).expanduser()
    same = folder / path.name
    trace = _known(path)
    if same.is_file() or trace is None:
        return str(same)
    for name in (trace.file, trace.upstream_file):
        if (folder / name).is_file():
            return str(folder / name)
    return str(same)
