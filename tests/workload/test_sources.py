"""Public traces: where a missing one comes from, and finding one in a folder."""

from pathlib import Path

import pytest

from baton.core.errors import WorkloadError
from baton.workload import load_trace
from baton.workload.sources import PUBLIC_TRACES, in_folder, missing_trace


@pytest.mark.parametrize("name", sorted(PUBLIC_TRACES))
def test_a_missing_public_trace_names_its_source_and_upstream_file(tmp_path, name):
    trace = PUBLIC_TRACES[name]
    with pytest.raises(WorkloadError) as err:
        load_trace(tmp_path / name)
    text = str(err.value)
    assert trace.url in text and trace.upstream_file in text and "--traces DIR" in text
    assert trace.url.startswith("https://github.com/") and trace.url.endswith(trace.upstream_file)


def test_an_unknown_missing_trace_says_only_that():
    assert missing_trace(Path("/x/mine.csv")) == "/x/mine.csv: no such trace file"


def test_in_folder_prefers_the_same_name_then_the_upstream_one(tmp_path):
    assert in_folder("/a/azure_conv_2023.csv", tmp_path) == str(tmp_path / "azure_conv_2023.csv")  # neither: ours
    (tmp_path / "AzureLLMInferenceTrace_conv.csv").write_text("x")
    assert in_folder("/a/azure_conv_2023.csv", tmp_path) == str(tmp_path / "AzureLLMInferenceTrace_conv.csv")
    (tmp_path / "azure_conv_2023.csv").write_text("x")
    assert in_folder("/a/azure_conv_2023.csv", tmp_path) == str(tmp_path / "azure_conv_2023.csv")
    assert in_folder("/a/mine.csv", tmp_path) == str(tmp_path / "mine.csv")
