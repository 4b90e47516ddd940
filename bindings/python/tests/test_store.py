"""The item store: the Store class and the search option "store"."""

from __future__ import annotations

import threading
from typing import Any, List

import pytest

import fetchq

from conftest import TIMEOUT, Server, has_function

# The library must have the item store (a missing function fails, never skips).


def test_upsert_items_get_count(tmp_path: Any) -> None:
    with fetchq.Store(tmp_path / "items.db") as s:
        assert s.count("posts") == 0 and s.items("posts") == []
        rep = s.upsert("posts", [{"id": "b", "v": 2}, {"id": "a", "v": 1}, {"id": 7, "v": 3}, {"v": 0}])
        assert rep == {"inserted": 3, "updated": 0, "unchanged": 0, "skipped": 1}
        assert s.count("posts") == 3
        assert s.get("posts", "a") == {"id": "a", "v": 1}
        assert s.get("posts", "7") is None                      # 7 is a number, "7" a string
        assert s.get("posts", "zz") is None
        with pytest.raises(TypeError):
            s.get("posts", 7)  # type: ignore[arg-type]
        assert [i["v"] for i in s.items("posts", sort="/v", descending=True)] == [3, 2, 1]
        # By id with the search rules: numbers before strings, both ways.
        assert [i["id"] for i in s.items("posts")] == [7, "a", "b"]
        assert [i["id"] for i in s.items("posts", descending=True)] == ["b", "a", 7]
        assert s.upsert("posts", [{"id": "a", "v": 10}], merge="keep-local") == \
            {"inserted": 0, "updated": 0, "unchanged": 1, "skipped": 0}
        assert s.get("posts", "a") == {"id": "a", "v": 1}
        assert s.upsert("posts", [{"id": "a", "v": 10}])["updated"] == 1
        assert s.get("posts", "a") == {"id": "a", "v": 10}
        assert s.upsert("posts", [{"key": "x"}], id_pointer="/key")["inserted"] == 1
        assert s.count("other") == 0
    assert s.closed
    with pytest.raises(fetchq.StateError):
        s.count("posts")
    with fetchq.Store(tmp_path / "items.db") as again:          # persisted
        assert again.count("posts") == 4


def test_store_errors(tmp_path: Any) -> None:
    with pytest.raises(fetchq.StoreError, match="nonexistent"):
        fetchq.Store(tmp_path / "nonexistent" / "x.db")
    with fetchq.Store(tmp_path / "e.db") as s:
        with pytest.raises(fetchq.InvalidArgument, match="merge"):
            s.upsert("c", [{"id": "a"}], merge="sometimes")
        with pytest.raises(fetchq.FetchqError):
            s.items("c", sort="no-slash")
        with pytest.raises(fetchq.FetchqError):
            s.upsert("c", [1, 2])                               # not objects
        assert s.count("c") == 0                                # all or nothing


def test_store_from_threads(tmp_path: Any) -> None:
    with fetchq.Store(tmp_path / "t.db") as s:
        def work(n: int) -> None:
            for i in range(20):
                s.upsert("c", [{"id": "%d-%d" % (n, i)}])
        threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(TIMEOUT)
        assert s.count("c") == 80


def test_search_option_store(net_engine: fetchq.Engine, server: Server, tmp_path: Any) -> None:
    path = str(tmp_path / "search.db")
    q = net_engine.queue("st")
    res = q.search("swift", store={"path": path, "collection": "posts"}).result(timeout=TIMEOUT)
    n = res["count"]
    assert res["store"] == {"inserted": n, "updated": 0, "unchanged": 0, "skipped": 0}
    again = q.search("swift", store={"path": path, "collection": "posts"}).result(timeout=TIMEOUT)
    assert again["store"]["unchanged"] == n
    with fetchq.Store(path) as s:
        assert s.count("posts") == n
        stored: List[Any] = s.items("posts", sort="/created_at", descending=True)
        assert stored == res["items"]
    with pytest.raises(fetchq.InvalidArgument):
        q.search("swift", store={"path": path})               # no collection


@pytest.mark.parametrize("order", ["desc", "asc"])
def test_search_option_store_keeps_the_item_sorted_first_of_an_id(net_engine: fetchq.Engine, tmp_path: Any,
                                                                   order: str) -> None:
    """One response with an id three times: the store keeps the item the
    search sorts first, the one a search-all keeps (it kept the last)."""
    path = str(tmp_path / "dup.db")
    q = net_engine.queue("dup")
    res = q.search("__dup", order=order, store={"path": path, "collection": "c"}).result(timeout=TIMEOUT)
    first_x = next(i for i in res["items"] if i["id"] == "x")
    assert first_x["v"] == (2 if order == "desc" else 1)    # created_at 03 / 01
    assert res["store"] == {"inserted": 2, "updated": 0, "unchanged": 0, "skipped": 2}
    merged = q.search_all(["__dup"], order=order).result(timeout=TIMEOUT)
    assert [i for i in merged["items"] if i["id"] == "x"] == [first_x]
    with fetchq.Store(path) as s:
        assert s.get("c", "x") == first_x and s.count("c") == 2


def test_search_option_store_takes_a_path_object(net_engine: fetchq.Engine, tmp_path: Any) -> None:
    """os.PathLike values of options are sent as their path (they raised
    TypeError: not JSON-serializable)."""
    path = tmp_path / "search-path.db"
    q = net_engine.queue("stp")
    res = q.search("swift", store={"path": path, "collection": "posts"}).result(timeout=TIMEOUT)
    assert res["count"] > 0 and res["store"]["inserted"] == res["count"]
    with fetchq.Store(path) as s:
        assert s.count("posts") == res["count"]
