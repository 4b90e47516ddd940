import CJansson
import Glibc
import Testing

@testable import FetchQ

// MARK: - Helpers shared by the Store*Tests files

/// A fresh directory from `mkdtemp`, removed (with the files in it) by `remove()`.
struct StoreTestDirectory {
    let path: String

    init() throws {
        var template = Array("/tmp/fetchq-store-XXXXXX".utf8CString)
        let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
        guard let made else { throw FetchQError(.store, "mkdtemp failed: errno \(errno)") }
        path = String(cString: made)
    }

    /// A path inside the directory.
    func file(_ name: String) -> String { path + "/" + name }

    /// Removes the files directly inside the directory (the store, its -wal and -shm
    /// files, links), then the directory. Bounded by the number of entries.
    func remove() {
        if let dir = opendir(path) {
            var names: [String] = []
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
                }
                if name != "." && name != ".." { names.append(name) }
            }
            closedir(dir)
            for name in names { unlink(file(name)) }
        }
        rmdir(path)
    }

    func exists(_ name: String) -> Bool { access(file(name), F_OK) == 0 }
}

/// Runs `body` with a temporary directory that is removed afterwards.
func withStoreDirectory<R>(_ body: (StoreTestDirectory) throws -> R) throws -> R {
    let directory = try StoreTestDirectory()
    defer { directory.remove() }
    return try body(directory)
}

func storeJSON(_ text: String) throws -> JSONRef {
    try JSONParser.parse(text, maxDepth: 64)
}

func storePointer(_ text: String) throws -> JSONPointer {
    try JSONPointer(text)
}

/// The canonical text of every element of `array`.
func storeTexts(_ array: JSONRef) -> [String] {
    array.elements.map { $0.dumps(compact: true, sorted: true) }
}

// MARK: - Tests

@Suite struct StoreTests {
    let idPointer = JSONPointer(tokens: ["id"])

    // MARK: upsert

    @Test func overwriteCountsAndStoredDocuments() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let first = try store.upsert(
                collection: "quotes",
                items: storeJSON(#"[{"id":"a","p":1},{"id":"b","p":2},{"id":"c","p":3}]"#),
                idPointer: idPointer, merge: .overwrite)
            #expect(
                first == ItemStore.UpsertReport(inserted: 3, updated: 0, unchanged: 0, skipped: 0))

            // a: same content, other key order -> unchanged; b: changed -> updated;
            // d: new -> inserted; two items without a usable id -> skipped.
            let second = try store.upsert(
                collection: "quotes",
                items: storeJSON(
                    #"[{"p":1,"id":"a"},{"id":"b","p":20},{"id":"d","p":4},{"p":5},{"id":null,"p":6}]"#
                ),
                idPointer: idPointer, merge: .overwrite)
            #expect(
                second == ItemStore.UpsertReport(inserted: 1, updated: 1, unchanged: 1, skipped: 2))
            #expect(try store.count(collection: "quotes") == 4)
            #expect(
                try storeTexts(store.items(collection: "quotes"))
                    == [
                        #"{"id":"a","p":1}"#, #"{"id":"b","p":20}"#, #"{"id":"c","p":3}"#,
                        #"{"id":"d","p":4}"#,
                    ])
        }
    }

    @Test func keepLocalKeepsStoredDocumentsAndInsertsNewIds() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            _ = try store.upsert(
                collection: "q", items: storeJSON(#"[{"id":1,"v":"local"},{"id":2,"v":"local"}]"#),
                idPointer: idPointer, merge: .overwrite)
            let report = try store.upsert(
                collection: "q",
                items: storeJSON(
                    #"[{"id":1,"v":"server"},{"id":2,"v":"local"},{"id":3,"v":"server"}]"#),
                idPointer: idPointer, merge: .keepLocal)
            #expect(
                report == ItemStore.UpsertReport(inserted: 1, updated: 0, unchanged: 2, skipped: 0))
            #expect(
                try storeTexts(store.items(collection: "q"))
                    == [
                        #"{"id":1,"v":"local"}"#, #"{"id":2,"v":"local"}"#,
                        #"{"id":3,"v":"server"}"#,
                    ])
        }
    }

    @Test func repeatedIdInOneBatchIsAppliedInOrder() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let batch = try storeJSON(#"[{"id":"x","n":1},{"id":"x","n":2},{"id":"x","n":2}]"#)
            let overwrite = try store.upsert(
                collection: "o", items: batch, idPointer: idPointer, merge: .overwrite)
            #expect(overwrite == ItemStore.UpsertReport(inserted: 1, updated: 1, unchanged: 1))
            #expect(try store.item(collection: "o", id: "x")?.dumps() == #"{"id":"x","n":2}"#)
            let keep = try store.upsert(
                collection: "k", items: batch, idPointer: idPointer, merge: .keepLocal)
            #expect(keep == ItemStore.UpsertReport(inserted: 1, updated: 0, unchanged: 2))
            #expect(try store.item(collection: "k", id: "x")?.dumps() == #"{"id":"x","n":1}"#)
        }
    }

    @Test func anExistingStoreOpensAndReadsWhileAnotherConnectionWrites() throws {
        // Opening a store set up before takes no write lock (it waited for
        // another process's write transaction, then failed "database is
        // locked": the ninth review). Reading goes on too (WAL); a write
        // waits, then fails with a clear message.
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            let first = try ItemStore(path: path, registryKey: nil, busyTimeoutMilliseconds: 200)
            _ = try first.upsert(collection: "c", items: storeJSON(#"[{"id":"a"}]"#), idPointer: idPointer,
                                 merge: .overwrite)
            let holder = try SQLiteConnection<FetchQError>(path: path, busyTimeoutMilliseconds: 200) {
                $0.fetchQError("holder", path: path)
            }
            try holder.execute("BEGIN IMMEDIATE")
            defer { holder.rollbackIfActive() }
            let second = try ItemStore(path: path, registryKey: nil, busyTimeoutMilliseconds: 200)
            #expect(try second.count(collection: "c") == 1)
            let batch = try storeJSON(#"[{"id":"b"}]"#)
            do throws(FetchQError) {
                _ = try second.upsert(collection: "c", items: batch, idPointer: idPointer, merge: .overwrite)
                Issue.record("a write went through another connection's write lock")
            } catch {
                #expect(error.status == .store && error.message.contains("locked"), "\(error.message)")
            }
        }
    }

    @Test func nestedIdPointerAndEmptyBatch() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let report = try store.upsert(
                collection: "c",
                items: storeJSON(#"[{"meta":{"key":"k1"},"v":1},{"meta":{},"v":2},{"v":3}]"#),
                idPointer: storePointer("/meta/key"), merge: .overwrite)
            #expect(report == ItemStore.UpsertReport(inserted: 1, skipped: 2))
            #expect(
                try store.item(collection: "c", id: "k1")?.dumps()
                    == #"{"meta":{"key":"k1"},"v":1}"#)
            let empty = try store.upsert(
                collection: "c", items: .array(), idPointer: idPointer, merge: .overwrite)
            #expect(empty == ItemStore.UpsertReport())
            #expect(try store.count(collection: "c") == 1)
        }
    }

    @Test func reportAsJSON() {
        let report = ItemStore.UpsertReport(inserted: 3, updated: 2, unchanged: 1, skipped: 4)
        #expect(report.json().dumps() == #"{"inserted":3,"updated":2,"unchanged":1,"skipped":4}"#)
        #expect(report.description == "inserted 3, updated 2, unchanged 1, skipped 4")
    }

    // MARK: reading

    @Test func sortedListingByNumbersBothOrders() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            _ = try store.upsert(
                collection: "q",
                items: storeJSON(
                    #"[{"id":"a","score":10},{"id":"b","score":-2.5},{"id":"c","score":3},"#
                        + #"{"id":"d"},{"id":"e","score":100},{"id":"f","score":3}]"#),
                idPointer: idPointer, merge: .overwrite)
            let ids = { (array: JSONRef) in array.elements.map { $0["id"]?.stringValue ?? "?" } }
            let up = try store.items(
                collection: "q", sortedBy: storePointer("/score"), descending: false)
            #expect(ids(up) == ["b", "c", "f", "a", "e", "d"])  // ties in id order, missing last
            let down = try store.items(
                collection: "q", sortedBy: storePointer("/score"), descending: true)
            #expect(ids(down) == ["e", "a", "c", "f", "b", "d"])
            #expect(ids(try store.items(collection: "q")) == ["a", "b", "c", "d", "e", "f"])
        }
    }

    /// Without a sort pointer the items come by id, with a search's order
    /// rules (numbers numerically, types by rank) and in both directions.
    @Test func listingByIdFollowsTheSortRulesInBothOrders() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            _ = try store.upsert(
                collection: "q",
                items: storeJSON(#"[{"id":9},{"id":10},{"id":2},{"id":"b"},{"id":"a"},{"id":true},{"id":2.5}]"#),
                idPointer: idPointer, merge: .overwrite)
            let ids = { (array: JSONRef) in array.elements.map { $0["id"]?.dumps() ?? "?" } }
            #expect(ids(try store.items(collection: "q")) == ["true", "2", "2.5", "9", "10", #""a""#, #""b""#])
            #expect(ids(try store.items(collection: "q", descending: true))
                    == [#""b""#, #""a""#, "10", "9", "2.5", "2", "true"])
        }
    }

    @Test func sortedListingByISODatesBothOrders() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            _ = try store.upsert(
                collection: "q",
                items: storeJSON(
                    #"[{"id":1,"at":"2024-03-01T10:00:00Z"},{"id":2,"at":"2023-12-31T23:59:59Z"},"#
                        + #"{"id":3,"at":"2024-03-01T09:59:59Z"},{"id":4,"at":"2025-01-01T00:00:00Z"}]"#
                ),
                idPointer: idPointer, merge: .overwrite)
            let ids = { (array: JSONRef) in array.elements.map { $0["id"]?.integerValue ?? -1 } }
            #expect(
                ids(try store.items(collection: "q", sortedBy: storePointer("/at"))) == [
                    2, 3, 1, 4,
                ])
            #expect(
                ids(
                    try store.items(
                        collection: "q", sortedBy: storePointer("/at"), descending: true))
                    == [4, 1, 3, 2])
        }
    }

    @Test func getByIdKeepsStringAndNumberIdsApart() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let report = try store.upsert(
                collection: "q",
                items: storeJSON(
                    #"[{"id":"1","kind":"string"},{"id":1,"kind":"integer"},{"id":1.5,"kind":"real"},"#
                        + #"{"id":{"b":2,"a":1},"kind":"object"},{"id":"q-1","kind":"text"}]"#),
                idPointer: idPointer, merge: .overwrite)
            #expect(report.inserted == 5)
            let kind = { (item: JSONRef?) in item?["kind"]?.stringValue }
            #expect(kind(try store.item(collection: "q", id: "1")) == "string")
            #expect(kind(try store.item(collection: "q", id: JSONRef.integer(1))) == "integer")
            #expect(kind(try store.item(collection: "q", id: JSONRef.real(1.5)!)) == "real")
            #expect(
                kind(try store.item(collection: "q", id: storeJSON(#"{"a":1,"b":2}"#))) == "object")
            #expect(kind(try store.item(collection: "q", id: "q-1")) == "text")
            #expect(try store.item(collection: "q", id: "2") == nil)
            #expect(try store.item(collection: "q", id: JSONRef.integer(2)) == nil)
            #expect(try store.item(collection: "q", id: JSONRef.null()) == nil)
            #expect(try store.item(collection: "other", id: "1") == nil)
            // Each lookup returns a new value (not shared with the store).
            let a = try #require(try store.item(collection: "q", id: "1"))
            let b = try #require(try store.item(collection: "q", id: "1"))
            #expect(a.pointer != b.pointer && a.isEqual(to: b))
        }
    }

    @Test func countAndCollectionsAreSeparate() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let items = try storeJSON(#"[{"id":1},{"id":2},{"id":3}]"#)
            _ = try store.upsert(
                collection: "a", items: items, idPointer: idPointer, merge: .overwrite)
            _ = try store.upsert(
                collection: "b", items: storeJSON(#"[{"id":1}]"#), idPointer: idPointer,
                merge: .overwrite)
            #expect(try store.count(collection: "a") == 3)
            #expect(try store.count(collection: "b") == 1)
            #expect(try store.count(collection: "none") == 0)
            #expect(try store.items(collection: "none").dumps() == "[]")
        }
    }

    @Test func reopenedFileHasTheDataAndUsesWAL() throws {
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            do {
                let store = try ItemStore(path: path)
                _ = try store.upsert(
                    collection: "q", items: storeJSON(#"[{"id":"a","t":"é\u0000x"},{"id":"b"}]"#),
                    idPointer: idPointer, merge: .overwrite)
                #expect(dir.exists("s.db-wal"))  // write-ahead log in use
                store.close()
                #expect(store.isClosed)
            }
            let reopened = try ItemStore(path: path)
            #expect(try reopened.count(collection: "q") == 2)
            let a = try #require(try reopened.item(collection: "q", id: "a"))
            #expect(a["t"]?.stringValue == "é\u{0}x")
            let again = try reopened.upsert(
                collection: "q", items: storeJSON(#"[{"id":"a","t":"é\u0000x"}]"#),
                idPointer: idPointer, merge: .overwrite)
            #expect(again == ItemStore.UpsertReport(unchanged: 1))
        }
    }

    // MARK: errors and atomicity

    @Test func invalidInputsWriteNothing() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let notArray = #expect(throws: FetchQError.self) {
                try store.upsert(
                    collection: "q", items: storeJSON(#"{"id":1}"#), idPointer: idPointer,
                    merge: .overwrite)
            }
            #expect(notArray?.status == .invalid)
            #expect(notArray?.message == "item store: items must be a JSON array, got an object")
            let notObject = #expect(throws: FetchQError.self) {
                try store.upsert(
                    collection: "q", items: storeJSON(#"[{"id":1},{"id":2},"x",{"id":3}]"#),
                    idPointer: idPointer, merge: .overwrite)
            }
            #expect(notObject?.status == .invalid)
            #expect(notObject?.message == "item store: item 2 is a string, not an object")
            let emptyName = #expect(throws: FetchQError.self) { try store.count(collection: "") }
            #expect(emptyName?.status == .invalid)
            #expect(try store.count(collection: "q") == 0)
        }
    }

    @Test func failureMidTransactionLeavesNothingOfTheBatch() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            let original = try storeJSON(#"[{"id":0,"v":"old"},{"id":1,"v":"old"}]"#)
            _ = try store.upsert(
                collection: "q", items: original, idPointer: idPointer, merge: .overwrite)

            // 10 items: updates of 0 and 1, then new ids 2...9; fail after the 6th write.
            let batch = JSONRef.array()
            for i in 0..<10 { batch.append(try storeJSON(#"{"id":\#(i),"v":"new"}"#)) }
            store.setAfterWriteHookForTesting { index throws(FetchQError) in
                if index == 5 { throw FetchQError(.operation, "injected failure") }
            }
            let error = #expect(throws: FetchQError.self) {
                try store.upsert(
                    collection: "q", items: batch, idPointer: idPointer, merge: .overwrite)
            }
            #expect(error?.status == .operation)
            #expect(error?.message == "injected failure")
            #expect(try store.count(collection: "q") == 2)
            #expect(
                try storeTexts(store.items(collection: "q")) == [
                    #"{"id":0,"v":"old"}"#, #"{"id":1,"v":"old"}"#,
                ])

            // The store stays usable, and the same batch now goes through whole.
            store.setAfterWriteHookForTesting(nil)
            let report = try store.upsert(
                collection: "q", items: batch, idPointer: idPointer, merge: .overwrite)
            #expect(report == ItemStore.UpsertReport(inserted: 8, updated: 2))
            #expect(try store.count(collection: "q") == 10)
        }
    }

    @Test func closedStoreAndBadFiles() throws {
        try withStoreDirectory { dir in
            let store = try ItemStore(path: dir.file("s.db"))
            store.close()
            store.close()  // idempotent
            let closed = #expect(throws: FetchQError.self) { try store.count(collection: "q") }
            #expect(closed?.status == .state)

            // Not an SQLite database.
            let junk = dir.file("junk.db")
            let fd = open(junk, O_CREAT | O_WRONLY, 0o600)
            let text = Array(String(repeating: "this is not a database ", count: 50).utf8)
            #expect(write(fd, text, text.count) == text.count)
            close(fd)
            let notDB = #expect(throws: FetchQError.self) { try ItemStore(path: junk) }
            #expect(notDB?.status == .store)
            #expect(notDB?.message.contains("not a database") == true)

            // Missing directory; empty path.
            let missing = #expect(throws: FetchQError.self) {
                try ItemStore(path: dir.file("no/such/dir/s.db"))
            }
            #expect(missing?.status == .store)
            let empty = #expect(throws: FetchQError.self) { try ItemStore(path: "") }
            #expect(empty?.status == .invalid)
            // In-memory databases cannot use WAL, so they are refused.
            let memory = #expect(throws: FetchQError.self) { try ItemStore(path: ":memory:") }
            #expect(memory?.status == .store)
        }
    }

    // MARK: shared instances

    @Test func sharedReturnsOneInstancePerFile() throws {
        try withStoreDirectory { dir in
            let a = try ItemStore.shared(path: dir.file("s.db"))
            let b = try ItemStore.shared(path: dir.path + "/./s.db")
            #expect(a === b)
            #expect(symlink(dir.file("s.db"), dir.file("link.db")) == 0)
            let c = try ItemStore.shared(path: dir.file("link.db"))
            #expect(a === c)
            #expect(a.path == dir.file("s.db") || a.path.hasSuffix("/s.db"))
            let other = try ItemStore.shared(path: dir.file("t.db"))
            #expect(other !== a)

            // close() unregisters: the next shared() opens a new instance.
            a.close()
            let d = try ItemStore.shared(path: dir.file("s.db"))
            #expect(d !== a && !d.isClosed)
            d.close()
            other.close()
        }
    }

    /// A file deleted (or replaced) while open: the path names another file
    /// now, and shared() opens that one, so that writes land in a file
    /// that exists (they went to the deleted one, reported as stored).
    @Test func sharedOpensTheFileThePathNamesNow() throws {
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            let old = try ItemStore.shared(path: path)
            _ = try old.upsert(collection: "c", items: storeJSON(#"[{"id":1}]"#), idPointer: idPointer, merge: .overwrite)
            for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
            let now = try ItemStore.shared(path: path)
            #expect(now !== old && !old.isClosed)  // the old holder keeps its instance
            _ = try now.upsert(collection: "c", items: storeJSON(#"[{"id":2}]"#), idPointer: idPointer, merge: .overwrite)
            #expect(dir.exists("s.db"))
            #expect(try ItemStore(path: path).count(collection: "c") == 1)
            #expect(try ItemStore.shared(path: path) === now)  // the same file: the same instance
            old.close()
            now.close()
        }
    }

    @Test func sharedRegistryDoesNotKeepStoresAlive() throws {
        try withStoreDirectory { dir in
            weak var weakStore: ItemStore?
            do {
                let store = try ItemStore.shared(path: dir.file("s.db"))
                weakStore = store
                #expect(weakStore != nil)
            }
            #expect(weakStore == nil)
        }
    }
}
