"""Image-text sources: WebDataset shards (index once, byte-range reads, local and
on S3), Parquet and Hugging Face tables with an image column, interleaved
documents, the recipe fields that declare them, and corrupt inputs named by
shard / file and key / row."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.images import encode, jpeg, noise, png, write_tar
from PIL import Image

from zephon import DataError, RecipeError, load_recipe
from zephon.images import prepare_image
from zephon.schema.recipe import ImageSpec
from zephon.sources import SourceReader, storage, webdataset
from zephon.sources.multimodal import ImageSegment, MultimodalDoc, TextSegment

SPEC = ImageSpec()
LONG = "a-folder-name-that-is-long-enough/" * 4  # > 100 bytes: GNU or PAX long names


def _png(seed: int) -> bytes:
    return encode(Image.fromarray(noise(20, 30, seed)), "PNG")


def _webp(seed: int) -> bytes:
    return encode(Image.fromarray(noise(16, 24, seed)), "WEBP")


def _recipe(tmp_path: Path, source: str, extra: str = "") -> Path:
    path = tmp_path / "r.toml"
    path.write_text(
        f'[execution]\ncache_dir = "{tmp_path / "cache"}"\n{extra}[[source]]\nname = "s"\n{source}'
    )
    return path


def _reader(tmp_path: Path, source: str, extra: str = "") -> SourceReader:
    recipe = load_recipe(_recipe(tmp_path, source, extra))
    return SourceReader(recipe.sources[0], str(tmp_path / "cache"))


def _shards(tmp_path: Path) -> tuple[list[Path], list[tuple[bytes, str]]]:
    """Two shards (GNU and PAX long names); returns them and the expected (image, text)."""
    folder = tmp_path / "shards"
    folder.mkdir()
    a, b, c, d, e = jpeg(20, 28, 1), _png(2), _webp(3), jpeg(24, 16, 4), _png(5)
    first = [
        (f"{LONG}k0.jpg", a),
        (f"{LONG}k0.txt", b"a red square"),
        (f"{LONG}k0.cls", b"3"),  # ignored
        ("only-a-label.cls", b"7"),  # a key without image or text: not a sample
        ("k1.png", b),
        ("k1.json", json.dumps({"caption": "two blue circles", "text": "ignored"}).encode()),
        ("k1.txt", b"two blue circles, from txt"),  # txt wins over json
    ]
    second = [
        ("dir/ünïcode.webp", c),
        ("dir/ünïcode.txt", "é caption".encode()),
        ("dir/k3.JPG", d),  # extensions match whatever their case
        ("dir/k3.json", json.dumps({"text": "from json"}).encode()),
        ("dir/k4.png", e),
        ("dir/k4.txt", b""),  # an empty caption is a caption
    ]
    paths = [
        write_tar(folder / "part-0.tar", first, format=tarfile.GNU_FORMAT),
        write_tar(folder / "part-1.tar", second, format=tarfile.PAX_FORMAT),
    ]
    expected = [
        (a, "a red square"),
        (b, "two blue circles, from txt"),
        (c, "é caption"),
        (d, "from json"),
        (e, ""),
    ]
    return paths, expected


def _pairs(docs: list[MultimodalDoc]) -> list[tuple[bytes, str]]:
    out = []
    for doc in docs:
        assert isinstance(doc, MultimodalDoc)
        image, text = doc.segments
        assert isinstance(image, ImageSegment) and isinstance(text, TextSegment)
        out.append((image.data, text.text))
    return out


def test_webdataset_index_once_and_byte_range_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths, expected = _shards(tmp_path)
    scans: list[str] = []
    real_scan = webdataset._scan
    monkeypatch.setattr(webdataset, "_scan", lambda obj: scans.append(obj.url) or real_scan(obj))
    reader = _reader(tmp_path, f'path = "{paths[0].parent}/*.tar"\n')  # format guessed
    assert reader.spec.format == "webdataset" and reader.spec.multimodal
    assert reader.num_docs == 5 and len(scans) == 2
    assert _pairs(reader.read_range(0, 5)) == expected
    docs = reader.read_range(1, 3)
    assert docs[0].name == f"{paths[0]}: key k1"
    assert docs[1].images[0].name == f"{paths[1]}: key dir/ünïcode (member dir/ünïcode.webp)"

    # A second reader (another rank or process) maps the index instead of scanning again,
    # and reads samples as byte ranges of their members, never whole shards.
    reads: list[tuple[str, int, int]] = []
    opens: list[str] = []
    real_pread, real_open = storage.LocalObject.pread, storage.LocalObject.open

    def pread(self: Any, offset: int, n: int) -> bytes:
        reads.append((self.url, offset, n))
        return real_pread(self, offset, n)

    def open_(self: Any) -> Any:
        opens.append(self.url)
        return real_open(self)

    monkeypatch.setattr(storage.LocalObject, "pread", pread)
    monkeypatch.setattr(storage.LocalObject, "open", open_)
    again = _reader(tmp_path, f'path = "{paths[0].parent}/*.tar"\n')
    assert len(scans) == 2 and opens == []
    order = [4, 0, 3, 1, 2]
    assert _pairs(again.read_docs(order)) == [expected[i] for i in order]
    reads.clear()
    assert _pairs(again.read_range(3, 4)) == [expected[3]]
    (url, offset, n) = reads[0]
    assert len(reads) == 1 and url == str(paths[1])
    member_bytes = len(expected[3][0]) + len(b'{"text": "from json"}')
    assert member_bytes <= n < member_bytes + 1024  # its two members and the header between
    assert n < os.path.getsize(paths[1]) // 2


def test_webdataset_image_field_and_sample_errors(tmp_path: Path) -> None:
    img, other, big = jpeg(16, 16, 1), _png(2), jpeg(64, 64, 2)
    shard = write_tar(
        tmp_path / "bad.tar",
        [
            ("two.jpg", img),
            ("two.png", other),
            ("two.txt", b"two images"),
            ("noimage.txt", b"no image"),
            ("notext.jpg", img),
            ("empty.jpg", b""),
            ("empty.txt", b"zero-size image"),
            ("badjson.jpg", img),
            ("badjson.json", b'{"caption": "no text field"}'),
            ("cut.jpg", big[: len(big) // 2]),
            ("cut.txt", b"a truncated JPEG"),
            ("head.jpg", img[:200]),
            ("head.txt", b"cut inside its header"),
            ("junk.png", b"not a png at all"),
            ("junk.txt", b"bytes that are not an image"),
            ("bomb.png", png(30_000, 20_000, 8, 2, None)),
            ("bomb.txt", b"huge dimensions"),
        ],
    )
    reader = _reader(tmp_path, f'path = "{shard}"\n')
    assert reader.num_docs == 9

    def error(i: int) -> str:
        with pytest.raises(DataError) as info:
            doc = reader.read_range(i, i + 1)[0]
            for image in doc.images:
                prepare_image(image.data, image.name, SPEC)
        return str(info.value)

    where = f"{shard}: key "
    assert error(0).startswith(where + "two: several image members (expected jpg or jpeg")
    assert "set image_field to choose one" in error(0)
    assert error(1).startswith(where + "noimage: no image member")
    assert error(2).startswith(where + "notext: no text (expected a txt member")
    assert error(3) == where + "empty: zero-size member empty.jpg"
    assert error(4).startswith(where + "badjson: member badjson.json has no field 'text'")
    assert error(5).startswith(where + "cut (member cut.jpg): cannot decode the JPEG image")
    assert error(6).startswith(where + "head (member head.jpg): cannot read the JPEG header")
    assert error(7).startswith(where + "junk (member junk.png): not an image")
    assert error(8).startswith(where + "bomb (member bomb.png): refused before decoding")
    chosen = _reader(tmp_path, f'path = "{shard}"\nimage_field = "png"\n')
    assert chosen.read_range(0, 1)[0].images[0].data == other
    caption = _reader(tmp_path, f'path = "{shard}"\ntext_field = "caption"\n')
    assert caption.read_range(4, 5)[0].text == "no text field"


def test_broken_shards_name_the_file_and_member(tmp_path: Path) -> None:
    img = jpeg(16, 16, 1)
    good = [("a.jpg", img), ("a.txt", b"x"), ("b.jpg", img), ("b.txt", b"y")]
    whole = write_tar(tmp_path / "whole.tar", good).read_bytes()
    cases = {
        "data.tar": (whole[: 512 + len(img) // 2], r"unexpected end of data|past the end"),
        "header.tar": (whole[: 512 * 3 + 100], r"truncated or corrupt tar header at byte 1536"),
        "garbage.tar": (b"x" * 3000, r"not a readable tar shard"),
        "back.tar": (None, r"key 'a' comes back at member 'a\.txt' after other keys"),
        "twice.tar": (None, r"key 'a' has two 'jpg' members"),
    }
    write_tar(tmp_path / "back.tar", [("a.jpg", img), ("b.jpg", img), ("a.txt", b"x")])
    write_tar(tmp_path / "twice.tar", [("a.jpg", img), ("a.jpg", img)])
    for name, (data, match) in cases.items():
        if data is not None:
            (tmp_path / name).write_bytes(data)
        with pytest.raises(DataError, match=rf"^{tmp_path / name}: .*({match})"):
            _reader(tmp_path, f'path = "{tmp_path / name}"\nformat = "webdataset"\n')


def _captions(n: int, seed: int = 0) -> tuple[list[bytes], list[str]]:
    return [jpeg(12 + i, 14, seed + i) for i in range(n)], [f"caption {i}" for i in range(n)]


def test_parquet_image_column_raw_bytes_and_struct(tmp_path: Path) -> None:
    images, texts = _captions(7)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    pq.write_table(
        pa.table({"img": images, "caption": texts}), tmp_path / "raw.parquet", row_group_size=3
    )
    cells = [{"bytes": b, "path": f"{i}.jpg"} for i, b in enumerate(images)]
    pq.write_table(
        pa.table({"img": pa.array(cells, type=struct), "caption": texts}),
        tmp_path / "struct.parquet",
        row_group_size=3,
    )
    for name in ("raw", "struct"):
        src = f'path = "{tmp_path / name}.parquet"\nimage_field = "img"\ntext_field = "caption"\n'
        reader = _reader(tmp_path, src)
        assert reader.num_docs == 7
        assert _pairs(reader.read_range(0, 7)) == list(zip(images, texts, strict=True))
        assert reader.read_range(4, 5)[0].name == f"{tmp_path / name}.parquet: row 4"

    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table(
            {
                "img": pa.array([cells[0], {"bytes": None, "path": "x.jpg"}, None], type=struct),
                "caption": ["ok", "path only", "null image"],
                "url": ["http://a", "http://b", "http://c"],
            }
        ),
        bad,
    )
    reader = _reader(tmp_path, f'path = "{bad}"\nimage_field = "img"\ntext_field = "caption"\n')
    with pytest.raises(
        DataError, match=rf"{bad}: row 1: field 'img' holds no image bytes \(only a path, 'x\.jpg'"
    ):
        reader.read_range(1, 2)
    with pytest.raises(
        DataError, match=rf"{bad}: row 2: field 'img' holds no image bytes \(null\)"
    ):
        reader.read_range(2, 3)
    with pytest.raises(
        DataError, match=rf"{bad}: no column 'image' \(columns: img, caption, url\)"
    ):
        _reader(tmp_path, f'path = "{bad}"\nimage_field = "image"\ntext_field = "caption"\n')
    with pytest.raises(
        DataError, match=r"column 'url' has type string; expected images \(binary .*URLs or paths"
    ):
        _reader(tmp_path, f'path = "{bad}"\nimage_field = "url"\ntext_field = "caption"\n')


def test_hf_disk_image_feature_stays_undecoded(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    images, texts = _captions(5, seed=3)
    features = datasets.Features({"image": datasets.Image(), "text": datasets.Value("string")})
    ds = datasets.Dataset.from_dict(
        {"image": [{"bytes": b, "path": None} for b in images], "text": texts}, features=features
    )
    ds.save_to_disk(str(tmp_path / "ds"))
    src = f'path = "{tmp_path / "ds"}"\nformat = "hf_disk"\nimage_field = "image"\n'
    reader = _reader(tmp_path, src)
    assert reader.spec.format == "hf_disk" and reader.num_docs == 5
    assert _pairs(reader.read_range(1, 4)) == list(zip(images, texts, strict=True))[1:4]


def test_interleaved_documents(tmp_path: Path) -> None:
    a, b, c = jpeg(20, 20, 1), _png(2), _webp(3)
    struct = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    texts = [["intro", None, "middle", None, None, "end"], [None, "only text"], ["t"]]
    images = [
        [
            None,
            {"bytes": a, "path": None},
            None,
            {"bytes": b, "path": None},
            {"bytes": c, "path": None},
            None,
        ],
        [None, None],
        [None],
    ]
    path = tmp_path / "docs.parquet"
    pq.write_table(
        pa.table(
            {
                "texts": pa.array(texts, type=pa.list_(pa.string())),
                "images": pa.array(images, type=pa.list_(struct)),
            }
        ),
        path,
    )
    src = f'path = "{path}"\ntexts_field = "texts"\nimages_field = "images"\n'
    docs = _reader(tmp_path, src).read_range(0, 3)
    first = docs[0].segments
    assert [type(s).__name__[0] for s in first] == list("TITIIT")
    assert [s.data for s in docs[0].images] == [a, b, c]
    assert docs[0].images[1].name == f"{path}: row 0 image 3"
    assert docs[0].text == "intromiddleend"
    assert docs[1].segments == (TextSegment("only text"),)  # both null at 0: skipped
    assert prepare_image(c, docs[0].images[2].name, SPEC).grid == (4, 6)

    bad = tmp_path / "bad.parquet"
    pq.write_table(
        pa.table(
            {
                "texts": pa.array([["x", "y"], ["x"]], type=pa.list_(pa.string())),
                "images": pa.array(
                    [[{"bytes": a, "path": None}, None], [None, None]], type=pa.list_(struct)
                ),
                "urls": pa.array([["u", None], [None]], type=pa.list_(pa.string())),
            }
        ),
        bad,
    )
    reader = _reader(tmp_path, f'path = "{bad}"\ntexts_field = "texts"\nimages_field = "images"\n')
    with pytest.raises(
        DataError, match=rf"{bad}: row 0: position 0 holds both a text and an image"
    ):
        reader.read_range(0, 1)
    with pytest.raises(DataError, match=rf"{bad}: row 1: 'texts' has 1 entries but 'images' has 2"):
        reader.read_range(1, 2)
    with pytest.raises(
        DataError,
        match=r"column 'urls' has type list<.*string>; expected a list of images \(binary.*URLs",
    ):
        _reader(tmp_path, f'path = "{bad}"\ntexts_field = "texts"\nimages_field = "urls"\n')


def test_recipe_image_fields(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    write_tar(tmp_path / "a.tar", [("k.jpg", jpeg(8, 8)), ("k.txt", b"x")])
    pq.write_table(pa.table({"t": ["x"]}), tmp_path / "a.parquet")
    base = load_recipe(_recipe(tmp_path, 'path = "a.parquet"\ntext_field = "t"\n'))
    assert "image_field" not in base.data_identity()["sources"][0]  # unset: not in the digest
    with_image = load_recipe(_recipe(tmp_path, 'path = "a.parquet"\nimage_field = "im"\n'))
    assert with_image.data_identity()["sources"][0]["image_field"] == "im"
    for source, match in [
        ('path = "a.jsonl"\nimage_field = "im"\n', r"image_field: format 'jsonl' holds text only"),
        (
            'path = "a.tar"\ntoken_field = "ids"\n',
            r"token_field: pretokenized ids cannot be combined",
        ),
        (
            'path = "a.parquet"\ntexts_field = "t"\n',
            r"texts_field: interleaved documents need both",
        ),
        (
            'path = "a.parquet"\nimage_field = "i"\ntexts_field = "t"\nimages_field = "j"\n',
            r"image_field: image_field \(one image per record\) and images_field",
        ),
        (
            'path = "a.tar"\nimage_field = "gif"\n',
            r"image_field: expected the image member's extension",
        ),
        (
            'path = "a.tar"\nimages_field = "j"\n',
            r"images_field: a WebDataset sample holds one image",
        ),
        (
            'path = "a.tar"\nformat = "tar"\n',
            r"format: expected one of auto, .*webdataset; got 'tar'",
        ),
    ]:
        with pytest.raises(RecipeError, match=rf"source 's'\.{match}"):
            load_recipe(_recipe(tmp_path, source))


def test_webdataset_on_s3_reads_headers_by_ranges(
    moto_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import s3fs

    from zephon.sources import remote

    paths, expected = _shards(tmp_path)
    big = encode(Image.fromarray(noise(900, 1200, seed=9)), "PNG", compress_level=0)  # ~3 MB
    shard = write_tar(
        tmp_path / "big.tar",
        [("a.png", big), ("a.txt", b"big"), ("b.jpg", expected[0][0]), ("b.txt", b"small")],
    )
    fs = s3fs.S3FileSystem(endpoint_url=moto_endpoint)
    fs.mkdir("wds")
    for p in [*paths, shard]:
        fs.put(str(p), f"wds/{p.name}")
    fetched: list[int] = []
    real_fetch = remote.RemoteObject.fetch

    def fetch(self: Any, start: int, end: int) -> bytes:
        fetched.append(end - start)
        return real_fetch(self, start, end)

    monkeypatch.setattr(remote.RemoteObject, "fetch", fetch)
    storage_table = f'[storage]\nendpoint_url = "{moto_endpoint}"\n'
    reader = _reader(tmp_path, 'path = "s3://wds/big.tar"\n', storage_table)
    # the index skipped the 3 MB member: headers were read in ranges, not the shard
    assert 0 < sum(fetched) < os.path.getsize(shard) // 2
    assert _pairs(reader.read_range(0, 2)) == [(big, "big"), (expected[0][0], "small")]
    assert list(reader.remote_versions()) == ["s3://wds/big.tar"]

    remote_parts = _reader(tmp_path, 'path = "s3://wds/part-*.tar"\n', storage_table)
    assert _pairs(remote_parts.read_docs([4, 0, 2])) == [expected[i] for i in (4, 0, 2)]
    assert _pairs(remote_parts.read_range(0, 5)) == expected


def test_validate_describes_image_sources(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from zephon.tools.cli import main

    paths, _ = _shards(tmp_path)
    pq.write_table(pa.table({"im": [jpeg(8, 8)], "t": ["x"]}), tmp_path / "a.parquet")
    recipe = _recipe(
        tmp_path,
        f'path = "{paths[0].parent}/*.tar"\nimage_field = "png"\n'
        f'[[source]]\nname = "p"\npath = "a.parquet"\nimage_field = "im"\ntext_field = "t"\n',
        "[recipe]\nlanes = 2\n",
    )
    # seq_len 1025: a row holds the largest image the default [image] allows (1026 tokens)
    assert main(["validate", str(recipe), "--seq-len", "1025"]) == 0
    out = capsys.readouterr().out
    assert "s: webdataset, 2 file(s), 5 docs, image member png with text from txt or json" in out
    assert "p: parquet, 1 file(s), 1 docs, image 'im' with text 't'" in out
