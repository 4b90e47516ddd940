import CJansson
import Glibc
import Testing

@testable import FetchQ

/// Crash safety: a child process commits one batch, then dies by SIGKILL in the middle of
/// a second, large transaction. The child is a Swift Testing exit test: a fresh process
/// started from the test binary (posix_spawn), which is safer than fork() in this
/// multithreaded test process (a forked child could inherit a lock held by another
/// test's thread).
@Suite struct StoreCrashTests {
    static let committed = 100
    static let uncommitted = 5000  // ~5 MB: more than SQLite's page cache, so frames reach the WAL
    static let killAt = 4900

    static func committedDoc(_ i: Int) -> String { #"{"id":\#(i),"v":"committed"}"# }

    static func uncommittedBatch() -> JSONRef {
        // Updates every committed id, then adds new ids, each with a 1 KB payload.
        let pad = String(repeating: "u", count: 1000)
        let batch = JSONRef.array()
        for i in 0..<uncommitted {
            batch.append(try! storeJSON(#"{"id":\#(i),"v":"uncommitted","pad":"\#(pad)"}"#))
        }
        return batch
    }

    @Test func killMidTransactionKeepsCommittedAndDropsTheRest() async throws {
        let directory = try StoreTestDirectory()
        defer { directory.remove() }
        let path = directory.file("crash.db")

        await #expect(processExitsWith: .signal(SIGKILL)) { [path = path as String] in
            let store = try ItemStore(path: path)
            let first = JSONRef.array()
            for i in 0..<StoreCrashTests.committed {
                first.append(try storeJSON(StoreCrashTests.committedDoc(i)))
            }
            let report = try store.upsert(
                collection: "c", items: first, idPointer: JSONPointer(tokens: ["id"]),
                merge: .overwrite)
            guard report.inserted == StoreCrashTests.committed else { exit(2) }
            store.setAfterWriteHookForTesting { index throws(FetchQError) in
                if index == StoreCrashTests.killAt { kill(getpid(), SIGKILL) }
            }
            _ = try? store.upsert(
                collection: "c", items: StoreCrashTests.uncommittedBatch(),
                idPointer: JSONPointer(tokens: ["id"]), merge: .overwrite)
            exit(3)  // not reached if the hook killed the process mid-transaction
        }

        // The child died holding an open write transaction: the WAL is left behind.
        // Its frames include the uncommitted transaction's spilled pages (megabytes).
        var info = stat()
        #expect(stat(directory.file("crash.db-wal"), &info) == 0)
        #expect(info.st_size > 1_000_000)
        let store = try ItemStore(path: path)
        #expect(try store.count(collection: "c") == Self.committed)
        let items = try store.items(collection: "c", sortedBy: JSONPointer(tokens: ["id"]))
        #expect(items.count == Self.committed)
        for (i, item) in items.elements.enumerated() {
            #expect(item.isEqual(to: try storeJSON(Self.committedDoc(i))))
        }
        #expect(try store.item(collection: "c", id: .integer(Int64(Self.committed))) == nil)
        #expect(try store.item(collection: "c", id: .integer(Int64(Self.killAt))) == nil)

        // The recovered file takes new writes.
        let report = try store.upsert(
            collection: "c", items: storeJSON(#"[{"id":0,"v":"after"}]"#),
            idPointer: JSONPointer(tokens: ["id"]), merge: .overwrite)
        #expect(report == ItemStore.UpsertReport(updated: 1))
    }
}
