import Glibc
import Testing

@testable import FetchQ

/// A directory from `mkdtemp`, removed with its files afterwards.
func withCacheDirectory<R>(_ body: (String) throws -> R) throws -> R {
    var template = Array("/tmp/fetchq-cache-XXXXXX".utf8CString)
    guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) }) else {
        throw FetchQError(.store, "mkdtemp failed: errno \(errno)")
    }
    let path = String(cString: made)
    defer {
        if let dir = opendir(path) {
            var names: [String] = []
            while let entry = readdir(dir) {
                let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                    String(cString: raw.bindMemory(to: CChar.self).baseAddress!)
                }
                if name != "." && name != ".." { names.append(name) }
            }
            closedir(dir)
            for name in names { unlink(path + "/" + name) }
        }
        rmdir(path)
    }
    return try body(path)
}

/// Write-through to SQLite: entries survive a new instance, evictions reach the file.
@Suite struct HTTPCachePersistenceTests {
    typealias Headers = [(name: String, value: String)]
    static let t0 = 1_700_000_000.0
    static let fresh: Headers = [("Cache-Control", "max-age=600")]

    static func put(_ cache: HTTPCache, _ key: String, _ body: [UInt8], headers: Headers = fresh)
        -> Bool
    {
        cache.store(
            key, status: 200, headers: headers, body: body, requestCacheControl: nil, now: t0)
    }

    static func body(_ key: String, _ count: Int = 100) -> [UInt8] {
        let seed = key.utf8.reduce(0) { $0 &* 131 &+ Int($1) }
        return (0..<count).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ seed) }
    }

    /// Another process stored an entry that is stale at once (max-age=0) after a lookup read
    /// the clock and before it read the file (while it waited for the cache's lock): judged
    /// at the earlier time, it looked fresh and was served without asking the server (the
    /// seventh review, four processes sharing a file). The clock is now read after the
    /// entry. Here the other instance writes its row when `now` is evaluated: read before
    /// the file, the lookup got that row, stale a moment later but fresh at `now`.
    @Test func aLookupReadsTheClockAfterTheEntry() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let writer = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            let reader = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            let staleAtOnce: Headers = [("Cache-Control", "max-age=0"), ("ETag", "\"v1\"")]
            func storedByTheOtherProcess(at time: Double) -> Double {
                #expect(writer.store("k", status: 200, headers: staleAtOnce, body: [2], requestCacheControl: nil,
                                     now: time + 5))
                return time
            }
            // an older answer in the file, stale since t0 - 100
            #expect(writer.store("k", status: 200, headers: staleAtOnce, body: [1], requestCacheControl: nil,
                                 now: Self.t0 - 100))
            guard case .stale(let older) = reader.lookup("k", now: storedByTheOtherProcess(at: Self.t0)) else {
                Issue.record("judged at the time it was read, the entry is stale")
                return
            }
            #expect(older.body == [1])
            // (the row written meanwhile is stale from t0 + 5 on: a later look, and the same race)
            let other = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            let fresh = other.hasFresh("k", now: storedByTheOtherProcess(at: Self.t0 + 5.5))  // (not in #expect,
            #expect(!fresh)  // which reads its arguments before the call)
            guard case .stale(let newer) = other.lookup("k", now: Self.t0 + 11) else {
                Issue.record("the newest row is stale from t0 + 10.5 on")
                return
            }
            #expect(newer.body == [2])
        }
    }

    /// The file deleted while the cache is open: its writes went to the deleted file and
    /// were lost with it, and nothing said so (the seventh review). The next write makes
    /// the file again at its path; what the old file held is not written back, also when
    /// only the main file was deleted and its log was left beside the path.
    @Test(arguments: [false, true])
    func aDeletedFileIsMadeAgainAtTheNextWrite(logLeftBehind: Bool) throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            for i in 0..<20 { #expect(Self.put(cache, "before-\(i)", Self.body("before-\(i)"))) }
            #expect(!cache.takeReopened())
            for suffix in logLeftBehind ? [""] : ["", "-wal", "-shm"] { unlink(path + suffix) }
            #expect(Self.put(cache, "after", Self.body("after")))
            #expect(cache.takeReopened())
            #expect(!cache.takeReopened(), "reported once")
            #expect(cache.persistenceError == nil)
            #expect(access(path, F_OK) == 0)
            // still held in memory
            #expect(cache.lookup("before-0", now: Self.t0).entry?.body == Self.body("before-0"))
            let reopened = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(reopened.lookup("after", now: Self.t0).entry?.body == Self.body("after"))
            #expect(reopened.lookup("before-0", now: Self.t0).entry == nil, "a cleared file stays cleared")
            #expect(reopened.lookup("before-19", now: Self.t0).entry == nil)
        }
    }

    /// A file replaced by another while open (moved into the path) is not followed: the
    /// log beside the path may be either file's, and a connection opened there read the
    /// old log over the new file (the moved file's rows were lost, the old ones came
    /// back: the review of the session's own changes). A warning says so, once.
    @Test func aReplacedFileIsNotFollowedAndSaidSo() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let elsewhere = dir + "/elsewhere.sqlite"
            do {
                let mover = try HTTPCache(maxBytes: 1 << 20, persistPath: elsewhere)
                #expect(Self.put(mover, "moved", Self.body("moved")))
            }
            let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(Self.put(cache, "old", Self.body("old")))
            #expect(rename(elsewhere, path) == 0)
            #expect(Self.put(cache, "new", Self.body("new")))
            #expect(!cache.takeReopened())
            let warning = cache.takeUnreportedPersistenceError()
            #expect(warning?.message.contains("was replaced by another while open") == true)
            #expect(Self.put(cache, "newer", Self.body("newer")))
            #expect(cache.takeUnreportedPersistenceError() == nil, "said once")
            #expect(cache.lookup("new", now: Self.t0).entry?.body == Self.body("new"))
        }
    }

    @Test func entriesSurviveANewInstance() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let headers: Headers = [
                ("Content-Type", "application/json"),
                ("Cache-Control", "max-age=600, must-revalidate"),
                ("ETag", "\"v7\""), ("Last-Modified", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ("X-Empty", ""), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
            ]
            var binary = [UInt8](0...255)
            binary += [0, 0, 0]
            do {
                let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
                #expect(
                    cache.store(
                        "k", status: 203, headers: headers, body: binary, requestCacheControl: nil,
                        now: Self.t0))
                #expect(Self.put(cache, "empty", []))
                #expect(cache.persistenceError == nil)
            }
            #expect(access(path + "-wal", F_OK) == 0 || access(path, F_OK) == 0)
            let reopened = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(reopened.statistics.entries == 2)
            guard case .fresh(let entry) = reopened.lookup("k", now: Self.t0 + 10) else {
                Issue.record("expected a fresh entry")
                return
            }
            #expect(entry.status == 203)
            #expect(entry.body == binary)
            #expect(
                entry.headers.map { "\($0.name): \($0.value)" }
                    == headers.map { "\($0.name): \($0.value)" })
            #expect(entry.storedAt == Self.t0)
            #expect(entry.freshUntil == Self.t0 + 600)
            #expect(entry.etag == "\"v7\"")
            #expect(entry.lastModified == "Sun, 06 Nov 1994 08:49:37 GMT")
            #expect(entry.mustRevalidate)
            #expect(!entry.noCache)
            #expect(reopened.lookup("empty", now: Self.t0).entry?.body == [])
            #expect(reopened.lookup("other", now: Self.t0).entry == nil)
            let stats = reopened.statistics
            #expect(stats.hits == 2)  // loaded from the file
            #expect(stats.misses == 1)
            #expect(stats.entries == 2)
            #expect(reopened.keysByRecency == ["empty", "k"])
        }
    }

    @Test func evictionAndRemovalReachTheFile() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let each = HTTPCache.cost(key: "a", headers: Self.fresh, body: Self.body("a"))
            do {
                let cache = try HTTPCache(maxBytes: 2 * each, persistPath: path)
                #expect(Self.put(cache, "a", Self.body("a")))
                #expect(Self.put(cache, "b", Self.body("b")))
                #expect(Self.put(cache, "c", Self.body("c")))  // evicts "a"
                #expect(Self.put(cache, "d", Self.body("d")))  // evicts "b"
                cache.remove("d")
                #expect(cache.statistics.evictions == 2)
                #expect(cache.persistenceError == nil)
            }
            let reopened = try HTTPCache(maxBytes: 10 * each, persistPath: path)
            #expect(reopened.statistics.entries == 1)  // only "c" is in the file
            #expect(reopened.lookup("a", now: Self.t0).entry == nil)
            #expect(reopened.lookup("b", now: Self.t0).entry == nil)
            #expect(reopened.lookup("d", now: Self.t0).entry == nil)
            #expect(reopened.lookup("c", now: Self.t0).entry?.body == Self.body("c"))
        }
    }

    @Test func openingTrimsTheFileToMaxBytesKeepingTheNewest() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let each = HTTPCache.cost(key: "k0", headers: Self.fresh, body: Self.body("k0"))
            do {
                let cache = try HTTPCache(maxBytes: 10 * each, persistPath: path)
                for i in 0..<5 { #expect(Self.put(cache, "k\(i)", Self.body("k\(i)"))) }
                // Re-storing k0 makes it the newest row.
                #expect(Self.put(cache, "k0", Self.body("k0")))
            }
            do {
                let small = try HTTPCache(maxBytes: 2 * each, persistPath: path)
                #expect(small.statistics.entries == 2)
                #expect(small.statistics.bytes == 2 * each)
            }
            let large = try HTTPCache(maxBytes: 10 * each, persistPath: path)
            #expect(large.statistics.entries == 2)
            #expect(large.lookup("k0", now: Self.t0).entry != nil)
            #expect(large.lookup("k4", now: Self.t0).entry != nil)
            #expect(large.lookup("k1", now: Self.t0).entry == nil)
        }
    }

    @Test func rowsFromTheFileAreEvictedFirst() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            let each = HTTPCache.cost(key: "a", headers: Self.fresh, body: Self.body("a"))
            do {
                let cache = try HTTPCache(maxBytes: 3 * each, persistPath: path)
                for key in ["a", "b", "c"] { #expect(Self.put(cache, key, Self.body(key))) }
            }
            let cache = try HTTPCache(maxBytes: 3 * each, persistPath: path)
            #expect(cache.statistics.bytes == 3 * each)
            // "a" is the oldest row, but using it loads it: "b" is evicted first, then "c".
            #expect(cache.lookup("a", now: Self.t0).entry != nil)
            #expect(Self.put(cache, "d", Self.body("d")))
            #expect(Self.put(cache, "e", Self.body("e")))
            #expect(cache.statistics.evictions == 2)
            #expect(cache.statistics.bytes == 3 * each)
            #expect(cache.lookup("b", now: Self.t0).entry == nil)
            #expect(cache.lookup("c", now: Self.t0).entry == nil)
            #expect(cache.keysByRecency == ["e", "d", "a"])
            let again = try HTTPCache(maxBytes: 3 * each, persistPath: path)
            #expect(again.statistics.entries == 3)
            for key in ["a", "d", "e"] {
                #expect(again.lookup(key, now: Self.t0).entry?.body == Self.body(key), "\(key)")
            }
        }
    }

    @Test func refreshIsPersisted() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            do {
                let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
                #expect(
                    Self.put(
                        cache, "k", Array("v".utf8),
                        headers: [("Cache-Control", "max-age=60"), ("ETag", "\"1\"")]))
                let refreshed = cache.refresh(
                    "k", notModifiedHeaders: [("Cache-Control", "max-age=120")], now: Self.t0 + 1000
                )
                #expect(refreshed?.freshUntil == Self.t0 + 1120)
            }
            let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(cache.lookup("k", now: Self.t0 + 1100).entry?.freshUntil == Self.t0 + 1120)
            // A refresh can also load the entry from the file.
            let other = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(
                other.refresh("k", notModifiedHeaders: [], now: Self.t0 + 2000)?.body
                    == Array("v".utf8))
        }
    }

    @Test func removeAllEmptiesTheFile() throws {
        try withCacheDirectory { dir in
            let path = dir + "/cache.sqlite"
            do {
                let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
                for key in ["a", "b"] { #expect(Self.put(cache, key, Self.body(key))) }
                cache.removeAll()
                #expect(cache.statistics.entries == 0)
                #expect(cache.statistics.bytes == 0)
            }
            #expect(try HTTPCache(maxBytes: 1 << 20, persistPath: path).statistics.entries == 0)
        }
    }

    @Test func sharesAFileWithTheItemStore() throws {
        try withCacheDirectory { dir in
            let path = dir + "/data.sqlite"
            let store = try ItemStore(path: path)
            let item = JSONRef.object()
            item.set("id", .integer(1))
            let items = JSONRef.array()
            items.append(item)
            _ = try store.upsert(
                collection: "c", items: items, idPointer: JSONPointer(tokens: ["id"]),
                merge: .overwrite)
            let cache = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
            #expect(Self.put(cache, "k", Self.body("k")))
            #expect(try store.count(collection: "c") == 1)
            store.close()
            #expect(try ItemStore(path: path).count(collection: "c") == 1)
            #expect(
                try HTTPCache(maxBytes: 1 << 20, persistPath: path).lookup("k", now: Self.t0).entry
                    != nil)
        }
    }

    @Test func unusableFilesThrow() throws {
        try withCacheDirectory { dir in
            let junk = dir + "/junk"
            let fd = open(junk, O_CREAT | O_WRONLY, 0o600)
            let text = Array(String(repeating: "not a database ", count: 100).utf8)
            _ = text.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            close(fd)
            let error = #expect(throws: FetchQError.self) {
                try HTTPCache(maxBytes: 100, persistPath: junk)
            }
            #expect(error?.status == .store)
            #expect(throws: FetchQError.self) {
                try HTTPCache(maxBytes: 100, persistPath: dir + "/missing/dir/file")
            }
            let empty = #expect(throws: FetchQError.self) {
                try HTTPCache(maxBytes: 100, persistPath: "")
            }
            #expect(empty?.status == .invalid)
        }
    }
}
