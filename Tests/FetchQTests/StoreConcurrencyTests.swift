import CJansson
import Glibc
import Synchronization
import Testing

@testable import FetchQ

@Suite struct StoreConcurrencyTests {
    static let writers = 50
    static let batchesPerWriter = 4
    static let idsPerBatch = 30

    /// The ids writer `w` writes in batch `b`: 30 consecutive ids starting at 7w + 5b, so
    /// neighbouring writers and batches overlap heavily.
    static func ids(writer w: Int, batch b: Int) -> Range<Int> {
        (7 * w + 5 * b)..<(7 * w + 5 * b + idsPerBatch)
    }

    static var distinctIDs: Set<Int> {
        var all = Set<Int>()
        for w in 0..<writers {
            for b in 0..<batchesPerWriter { all.formUnion(ids(writer: w, batch: b)) }
        }
        return all
    }

    static func document(id: Int, writer: Int, batch: Int) -> String {
        #"{"id":\#(id),"writer":\#(writer),"batch":\#(batch),"pad":"\#(String(repeating: "x", count: id % 50))"}"#
    }

    /// 50 writers, each upserting 4 overlapping batches (odd writers with keep-local), on
    /// the stores `storeFor(writer)` returns; then checks that every id is stored exactly
    /// once, with a document one of the writers wrote for it, and that the reports add up.
    func hammer(path: String, storeFor: @escaping @Sendable (Int) -> ItemStore) throws {
        let failures = Mutex<[String]>([])
        let inserted = Atomic<Int>(0)
        let reported = Atomic<Int>(0)
        runThreads(Self.writers) { w in
            let store = storeFor(w)
            for b in 0..<Self.batchesPerWriter {
                let batch = JSONRef.array()
                for id in Self.ids(writer: w, batch: b) {
                    batch.append(try! storeJSON(Self.document(id: id, writer: w, batch: b)))
                }
                do {
                    let report = try store.upsert(
                        collection: "c", items: batch, idPointer: JSONPointer(tokens: ["id"]),
                        merge: w % 2 == 0 ? .overwrite : .keepLocal)
                    inserted.add(report.inserted, ordering: .relaxed)
                    reported.add(
                        report.inserted + report.updated + report.unchanged + report.skipped,
                        ordering: .relaxed)
                } catch {
                    failures.withLock { $0.append("writer \(w) batch \(b): \(error)") }
                }
            }
        }
        #expect(failures.withLock { $0 } == [])
        let distinct = Self.distinctIDs
        let store = storeFor(0)
        #expect(try store.count(collection: "c") == distinct.count)
        // Each id was inserted by exactly one upsert.
        #expect(inserted.load(ordering: .relaxed) == distinct.count)
        #expect(
            reported.load(ordering: .relaxed) == Self.writers * Self.batchesPerWriter
                * Self.idsPerBatch)

        let all = try store.items(collection: "c")
        var seen = Set<Int>()
        for item in all.elements {
            let id = Int(try #require(item["id"]?.integerValue))
            let w = Int(try #require(item["writer"]?.integerValue))
            let b = Int(try #require(item["batch"]?.integerValue))
            seen.insert(id)
            #expect(
                Self.ids(writer: w, batch: b).contains(id), "id \(id) has a version nobody wrote")
            #expect(item.isEqual(to: try storeJSON(Self.document(id: id, writer: w, batch: b))))
        }
        #expect(seen == distinct)

        // And the same from a fresh connection.
        let reopened = try ItemStore(path: path)
        #expect(try reopened.count(collection: "c") == distinct.count)
    }

    /// File names are bytes: "\u{E9}.db" and "e\u{301}.db" are two files, so two
    /// stores (the registry, keyed by `String`, handed out the first for both).
    @Test func pathsDifferingOnlyInUnicodeFormAreTwoStores() throws {
        try withStoreDirectory { dir in
            let composed = try ItemStore.shared(path: dir.file("\u{E9}.db"))
            let decomposed = try ItemStore.shared(path: dir.file("e\u{301}.db"))
            #expect(composed !== decomposed)
            _ = try composed.upsert(collection: "c", items: try storeJSON(#"[{"id": 1}]"#),
                                    idPointer: JSONPointer(tokens: ["id"]), merge: .overwrite)
            #expect(try composed.count(collection: "c") == 1)
            #expect(try decomposed.count(collection: "c") == 0)
            #expect(try ItemStore.shared(path: dir.file("\u{E9}.db")) === composed)
        }
    }

    @Test func fiftyWritersSharingOneStoreLoseNothing() throws {
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            let store = try ItemStore.shared(path: path)
            try hammer(path: path) { _ in
                // Every writer looks the store up, as operations do.
                (try? ItemStore.shared(path: path)) ?? store
            }
            #expect(try ItemStore.shared(path: path) === store)
        }
    }

    @Test func fiftyWritersOnSeparateConnectionsLoseNothing() throws {
        // Five independent instances (five SQLite connections) on one file: writers
        // coordinate through SQLite's locks, the busy timeout and the busy retry.
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            var stores: [ItemStore] = []
            for _ in 0..<5 { stores.append(try ItemStore(path: path)) }
            let fixed = stores
            try hammer(path: path) { w in fixed[w % fixed.count] }
        }
    }

    @Test func readersDuringWritesSeeWholeBatches() throws {
        // Every batch holds 20 new ids; readers on another connection must only ever see
        // a multiple of 20 items (a transaction is visible whole or not at all).
        try withStoreDirectory { dir in
            let path = dir.file("s.db")
            let writer = try ItemStore(path: path)
            let reader = try ItemStore(path: path)
            let torn = Mutex<[Int]>([])
            let done = Atomic<Bool>(false)
            runThreads(3) { role in
                if role == 0 {
                    for b in 0..<40 {
                        let batch = JSONRef.array()
                        for i in 0..<20 {
                            batch.append(.object())
                            batch[i]!.set("id", .integer(Int64(b * 20 + i)))
                        }
                        _ = try? writer.upsert(
                            collection: "c", items: batch, idPointer: JSONPointer(tokens: ["id"]),
                            merge: .overwrite)
                    }
                    done.store(true, ordering: .releasing)
                } else {
                    for _ in 0..<10_000 {  // bounded; normally ends when the writer is done
                        if done.load(ordering: .acquiring) { break }
                        let n = (try? reader.count(collection: "c")) ?? -1
                        if n < 0 || n % 20 != 0 { torn.withLock { $0.append(n) } }
                    }
                }
            }
            #expect(torn.withLock { $0 } == [])
            #expect(try reader.count(collection: "c") == 800)
        }
    }
}
