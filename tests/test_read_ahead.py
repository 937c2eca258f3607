"""solvers.io.read_ahead: the background reader that read_bal parses from gives exactly the bytes
that reading the file in place gives (bz2.open, gzip.open), and raises what they raise."""
import bz2
import gzip
import threading

import pytest

import solvers
from solvers.io import read_ahead

from bal_data import bal_file

TEXT = b"".join(b"%d %d %.17g %.17g\n" % (i % 7, i, i * 0.25, -i / 3) for i in range(20000))


def write(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    return str(path)


def read_all(path, size=-1):
    parts = []
    with read_ahead.ReadAhead(path, block=4096, ahead=2) as r:
        while True:
            part = r.read(size)
            if not part:
                return b"".join(parts)
            assert size < 0 or len(part) <= size
            parts.append(part)


@pytest.mark.parametrize("size", [-1, 1, 1000, 1 << 20])
def test_plain_bz2_gz_and_concatenated_streams_read_as_the_libraries_read_them(tmp_path, size):
    half = len(TEXT) // 2
    files = {
        "a.txt": TEXT,
        "a.txt.bz2": bz2.compress(TEXT),
        "a.txt.gz": gzip.compress(TEXT),
        # two streams / members back to back, as pbzip2 and `cat a.gz b.gz` write them
        "b.txt.bz2": bz2.compress(TEXT[:half]) + bz2.compress(TEXT[half:]),
        "b.txt.gz": gzip.compress(TEXT[:half]) + gzip.compress(TEXT[half:]),
    }
    for name, data in files.items():
        path = write(tmp_path, name, data)
        opener = bz2.open if name.endswith(".bz2") else gzip.open if name.endswith(".gz") else open
        with opener(path, "rb") as f:
            expected = f.read()
        assert expected == TEXT
        assert read_all(path, size if size != 1 or name == "a.txt" else 4096) == expected, name


def test_a_stream_ending_on_a_block_boundary_and_trailing_bytes(tmp_path):
    half = len(TEXT) // 2
    first = bz2.compress(TEXT[:half])
    path = write(tmp_path, "c.txt.bz2", first + bz2.compress(TEXT[half:]))
    with read_ahead.ReadAhead(path, block=len(first), ahead=2) as r:     # the second stream starts a block
        assert b"".join(iter(lambda: r.read(), b"")) == TEXT
    # bytes after the last stream that start none: ignored, as bz2.open and gzip.open do
    for name, data in (("d.txt.bz2", bz2.compress(TEXT) + b"not bzip2 data"),
                       ("d.txt.gz", gzip.compress(TEXT) + bytes(100))):
        path = write(tmp_path, name, data)
        opener = bz2.open if name.endswith(".bz2") else gzip.open
        with opener(path, "rb") as f:
            assert f.read() == TEXT
        assert read_all(path) == TEXT, name


def test_truncated_corrupt_and_missing_files_raise_what_reading_in_place_raises(tmp_path):
    cut_bz2 = write(tmp_path, "cut.txt.bz2", bz2.compress(TEXT)[:-20])
    with pytest.raises(EOFError):
        bz2.open(cut_bz2).read()
    with pytest.raises(EOFError):
        read_all(cut_bz2)
    cut_gz = write(tmp_path, "cut.txt.gz", gzip.compress(TEXT)[:-30])
    with pytest.raises(EOFError):
        gzip.open(cut_gz).read()
    with pytest.raises(EOFError):
        read_all(cut_gz)
    bad = bytearray(bz2.compress(TEXT))
    bad[len(bad) // 2] ^= 0xFF
    bad_bz2 = write(tmp_path, "bad.txt.bz2", bytes(bad))
    with pytest.raises(OSError):
        bz2.open(bad_bz2).read()
    with pytest.raises(OSError):
        read_all(bad_bz2)
    bad = bytearray(gzip.compress(TEXT))
    bad[len(bad) // 2] ^= 0xFF
    with pytest.raises(OSError):
        read_all(write(tmp_path, "bad.txt.gz", bytes(bad)))
    with pytest.raises(FileNotFoundError):
        read_all(str(tmp_path / "missing.txt"))
    # read_bal turns them into its own errors, as before
    with pytest.raises(solvers.BALFormatError, match="cannot read the file"):
        solvers.read_bal(cut_bz2)
    with pytest.raises(solvers.BALFormatError, match="cannot read the file"):
        solvers.read_bal(tmp_path / "bad.txt.gz")
    with pytest.raises(FileNotFoundError):
        solvers.read_bal(tmp_path / "missing.txt.bz2")


def test_started_reader_is_taken_once_and_a_closed_one_stops_its_thread(tmp_path):
    p = solvers.synthetic_problem(5, 40, 3, seed=2)
    path = str(tmp_path / "p.txt.bz2")
    solvers.write_bal(p, path)
    read_ahead.start(path)
    first = read_ahead.take(path)
    assert read_ahead.take(path) is not first        # taken: a second take starts its own
    first.close()
    q = solvers.read_bal(path)
    assert (q.cameras == p.cameras).all() and (q.observations == p.observations).all()
    # a reader closed before its file is read leaves no thread behind
    big = write(tmp_path, "big.txt", TEXT * 20)
    before = set(threading.enumerate())
    r = read_ahead.ReadAhead(big, block=1024, ahead=1)
    r.read(10)
    mine = [t for t in threading.enumerate() if t not in before and t.name == "read-ahead"]
    assert len(mine) == 1 and mine[0].is_alive()        # waiting for room in its full queue
    r.close()
    mine[0].join(timeout=10)
    assert not mine[0].is_alive()


def test_real_bal_file_reads_the_same_through_the_reader(tmp_path):
    path = bal_file("problem-49-7776-pre")
    with bz2.open(path, "rb") as f:
        expected = f.read()
    assert read_all(path) == expected
