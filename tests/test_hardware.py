"""Cluster strings, host-RAM sizes and the GPU catalog (no torch)."""

from __future__ import annotations

import pytest

from grpo_pilot.errors import InputError
from grpo_pilot.hardware import ACCEPTED_FORMS, CATALOG, lookup_gpu, parse_cluster, parse_size_bytes

GiB = 1 << 30
MiB = 1 << 20


@pytest.mark.parametrize(
    ("text", "gpu", "nodes", "per_node", "label"),
    [
        ("8xA100-80G", "A100-80G", 1, 8, "8xA100-80G"),
        ("8xH100", "H100-80G", 1, 8, "8xH100-80G"),
        ("2x8xH100-80G", "H100-80G", 2, 8, "2x8xH100-80G"),
        ("16xH20", "H20", 2, 8, "2x8xH20"),
        ("4xL40S", "L40S", 1, 4, "4xL40S"),
        ("1xB200", "B200", 1, 1, "1xB200"),
    ],
)
def test_parse_cluster_forms(text: str, gpu: str, nodes: int, per_node: int, label: str) -> None:
    cluster = parse_cluster(text)
    assert cluster.gpu.name == gpu
    assert (cluster.num_nodes, cluster.gpus_per_node) == (nodes, per_node)
    assert cluster.world_size == nodes * per_node
    assert cluster.label() == label
    assert cluster.host_ram_bytes_per_node == 1024 * GiB  # default for GPU nodes


def test_parse_cpu() -> None:
    cluster = parse_cluster("1xcpu")
    assert cluster.gpu.is_cpu and cluster.world_size == 1
    assert cluster.host_ram_bytes_per_node == cluster.gpu.memory_bytes > 0


@pytest.mark.parametrize("text", ["8xa100-80g", "8XA100-80G", " 8 x A100-80g ", "8xa100_80gb", "8*A100-80G"])
def test_parse_cluster_is_case_and_separator_insensitive(text: str) -> None:
    cluster = parse_cluster(text)
    assert cluster.gpu.name == "A100-80G" and cluster.world_size == 8


def test_two_level_form_case_insensitive() -> None:
    assert parse_cluster("2X8Xh100-80g") == parse_cluster("2x8xH100-80G")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512GiB", 512 * GiB),
        ("512gib", 512 * GiB),
        ("2TiB", 2 << 40),
        ("2TB", 2 * 10**12),
        ("1.5TB", 1_500_000_000_000),
        ("768", 768 * GiB),
        ("64 GB", 64 * 10**9),
        ("256MiB", 256 * MiB),
    ],
)
def test_parse_size_bytes(text: str, expected: int) -> None:
    assert parse_size_bytes(text) == expected


def test_host_ram_override() -> None:
    cluster = parse_cluster("8xH100", host_ram_bytes_per_node=parse_size_bytes("2TiB"))
    assert cluster.host_ram_bytes_per_node == 2 << 40


@pytest.mark.parametrize("text", ["lots", "", "12 PB", "-5GiB", "GiB"])
def test_bad_size_is_input_error(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_size_bytes(text)
    assert "512GiB" in info.value.hint


@pytest.mark.parametrize("text", ["", "A100", "8x", "x8xH100", "8xH100x2", "eight x H100", "8-H100"])
def test_malformed_cluster_names_accepted_forms(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_cluster(text)
    assert ACCEPTED_FORMS in info.value.hint
    assert "8xA100-80G" in info.value.hint and "2x8xH100-80G" in info.value.hint


def test_unknown_gpu_lists_catalog_and_forms() -> None:
    with pytest.raises(InputError) as info:
        parse_cluster("8xV100")
    assert "Unknown GPU 'V100'" in info.value.message
    assert "H100-80G" in info.value.hint and ACCEPTED_FORMS in info.value.hint


@pytest.mark.parametrize("text", ["0xH100", "0x8xH100"])
def test_zero_gpus_is_input_error(text: str) -> None:
    with pytest.raises(InputError) as info:
        parse_cluster(text)
    assert "no GPUs" in info.value.message and ACCEPTED_FORMS in info.value.hint


def test_uneven_gpu_count_suggests_explicit_layout() -> None:
    with pytest.raises(InputError) as info:
        parse_cluster("12xH100")
    assert "do not split into nodes of 8" in info.value.message
    assert "2x6xH100-80G" in info.value.hint


def test_cpu_workers_are_one_node_of_n() -> None:
    two, many = parse_cluster("2xcpu"), parse_cluster("12xcpu")  # more than 8 CPU workers: still one node
    assert (two.num_nodes, two.gpus_per_node, two.world_size) == (1, 2, 2) and two.gpu.is_cpu
    assert (many.num_nodes, many.gpus_per_node) == (1, 12) and many.label() == "12xcpu"
    assert two.host_ram_bytes_per_node == two.gpu.memory_bytes
    with pytest.raises(InputError, match="this one machine") as info:
        parse_cluster("2x2xcpu")
    assert "2xcpu" in info.value.hint


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("H100", "H100-80G"),
        ("h100-sxm", "H100-80G"),
        ("a100 40gb", "A100-40G"),
        ("4090", "RTX4090"),
        ("mi300x", "MI300X"),
        ("b200-192g", "B200"),
        ("A800", "A800-80G"),
        ("h20-141g", "H20-141G"),
        ("H20", "H20"),
    ],
)
def test_gpu_aliases(alias: str, name: str) -> None:
    gpu = lookup_gpu(alias)
    assert gpu is not None and gpu.name == name
    assert lookup_gpu("TPUv5") is None


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_catalog_entry_is_positive_and_sourced(name: str) -> None:
    gpu = CATALOG[name]
    assert gpu.name == name and not gpu.is_cpu
    assert gpu.memory_bytes > 8 * GiB and gpu.memory_bytes % MiB == 0
    assert 1e13 < gpu.bf16_flops < 1e16  # dense BF16: 70 TF (A10G) .. 2.25 PF (B200)
    assert 1e11 < gpu.hbm_bytes_per_s < 1e13
    assert 0 < gpu.link_bytes_per_s < gpu.hbm_bytes_per_s
    assert len(gpu.source) > 40 and "dense" in gpu.source.lower()


def test_catalog_figures_from_datasheets() -> None:
    """Spot values that planning depends on most (see each entry's `source`)."""
    assert CATALOG["H100-80G"].memory_bytes == 81559 * MiB
    assert CATALOG["H100-80G"].bf16_flops == 989e12
    assert CATALOG["H100-80G"].link_bytes_per_s == 450e9  # NVLink4 900 GB/s bidirectional / 2
    assert CATALOG["H800"].link_bytes_per_s == 200e9
    assert CATALOG["B200"].memory_bytes == 183359 * MiB  # nvidia-smi, HGX B200
    assert CATALOG["B200"].hbm_bytes_per_s == 7.7e12
    assert CATALOG["MI300X"].memory_bytes == 206141652992  # rocm-smi VRAM total
    assert CATALOG["MI300X"].bf16_flops == 1307e12
    assert CATALOG["A100-80G"].hbm_bytes_per_s == 2039e9 > CATALOG["A100-40G"].hbm_bytes_per_s
    assert CATALOG["A800-80G"].bf16_flops == CATALOG["A100-80G"].bf16_flops
    assert CATALOG["A800-80G"].link_bytes_per_s == 200e9  # NVLink cut to 400 GB/s bidirectional
    assert CATALOG["H20-141G"].bf16_flops == CATALOG["H20"].bf16_flops == 148e12
    assert CATALOG["H20-141G"].memory_bytes == CATALOG["H200"].memory_bytes > CATALOG["H20"].memory_bytes


def test_local_detection_matches_the_catalog_by_name_and_memory(monkeypatch):
    """`--gpus local` on a node whose torch reports 8 × 'NVIDIA H100 80GB HBM3' of 81559 MiB."""
    torch = pytest.importorskip("torch")
    from types import SimpleNamespace

    from grpo_pilot.hardware.detect import local_cluster

    props = SimpleNamespace(name="NVIDIA H100 80GB HBM3", total_memory=81559 * (1 << 20))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    cluster = local_cluster(512 * (1 << 30))
    assert cluster.label() == "8xH100-80G" and cluster.host_ram_bytes_per_node == 512 * (1 << 30)
    props.name, props.total_memory = "NVIDIA A100-SXM4-40GB", 40960 * (1 << 20)
    assert local_cluster().label() == "8xA100-40G"  # the A100 of the nearest memory size
    # "H20" is a substring of "H200": the most specific name wins, then the nearest memory size
    props.name, props.total_memory = "NVIDIA H200", 143771 * (1 << 20)
    assert local_cluster().label() == "8xH200"
    props.name = "NVIDIA H20"
    assert local_cluster().label() == "8xH20-141G"
    props.total_memory = 97871 * (1 << 20)
    assert local_cluster().label() == "8xH20"


def test_local_without_cuda_is_an_input_error_naming_alternatives(monkeypatch):
    torch = pytest.importorskip("torch")
    from grpo_pilot.errors import InputError
    from grpo_pilot.hardware.detect import local_cluster

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(InputError) as info:
        local_cluster()
    assert "1xcpu" in info.value.hint and "8xA100-80G" in info.value.hint
