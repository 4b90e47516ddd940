import Glibc
import Synchronization
import Testing

@testable import FetchQ

/// Eight threads hammering one cache: the size bound holds whenever the lock is free, the
/// structure stays consistent, bodies stay with their keys, and the counters add up.
@Suite struct HTTPCacheConcurrencyTests {
    static let threads = 8
    static let keys = 48
    static let t0 = 1_700_000_000.0

    /// The body stored for `key` by writer `thread`: the key, a separator, then filler
    /// whose length depends on both, so entries have many different sizes.
    static func body(key: Int, thread: Int) -> [UInt8] {
        Array("k\(key)|".utf8)
            + [UInt8](repeating: UInt8(thread), count: (key * 37 + thread * 101) % 700)
    }

    /// A cheap deterministic generator per thread (no shared state).
    struct Random {
        var state: UInt64
        mutating func next(_ bound: Int) -> Int {
            state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407
            return Int((state >> 33) % UInt64(bound))
        }
    }

    /// Runs the mixed workload; returns the problems seen by the threads.
    static func hammer(_ cache: HTTPCache, operations: Int) -> (problems: [String], lookups: Int) {
        let problems = Mutex<[String]>([])
        let lookups = Atomic<Int>(0)
        runThreads(threads) { thread in
            var random = Random(state: UInt64(thread + 1) * 0x9E37_79B9)
            func problem(_ text: String) {
                problems.withLock { $0.append("thread \(thread): \(text)") }
            }
            for step in 0..<operations {
                let key = random.next(keys)
                let name = "key-\(key)"
                let now = t0 + Double(step)
                switch random.next(10) {
                case 0...3:
                    lookups.add(1, ordering: .relaxed)
                    if let entry = cache.lookup(name, now: now).entry,
                        !entry.body.starts(with: Array("k\(key)|".utf8))
                    {
                        problem("\(name) returned another key's body")
                    }
                case 4...7:
                    let headers: [(name: String, value: String)] = [
                        ("Cache-Control", "max-age=\(random.next(30))"),
                        ("ETag", "\"\(thread)-\(step)\""),
                    ]
                    let stored = cache.store(
                        name, status: 200, headers: headers, body: body(key: key, thread: thread),
                        requestCacheControl: nil, now: now)
                    if !stored { problem("\(name) was not stored") }
                case 8:
                    if let entry = cache.refresh(
                        name, notModifiedHeaders: [("Cache-Control", "max-age=5")], now: now),
                        !entry.body.starts(with: Array("k\(key)|".utf8))
                    {
                        problem("refresh of \(name) returned another key's body")
                    }
                default:
                    cache.remove(name)
                }
                let bytes = cache.statistics.bytes
                if bytes > cache.maxBytes { problem("\(bytes) bytes > \(cache.maxBytes)") }
            }
        }
        return (problems.withLock { $0 }, lookups.load(ordering: .relaxed))
    }

    @Test func inMemory() throws {
        // About a quarter of the keys fit at once: plenty of evictions.
        let cache = try HTTPCache(maxBytes: 6_000)
        let (problems, lookups) = Self.hammer(cache, operations: 5_000)
        #expect(problems.isEmpty, "\(problems.prefix(5))")
        #expect(cache.consistencyProblems() == [])
        let stats = cache.statistics
        #expect(stats.bytes <= 6_000)
        #expect(stats.hits + stats.misses == lookups)
        #expect(stats.hits > 0)
        #expect(stats.misses > 0)
        #expect(stats.evictions > 0)
        #expect(stats.entries == cache.keysByRecency.count)
        // Every remaining entry is intact.
        for key in cache.keysByRecency {
            let entry = cache.lookup(key, now: Self.t0).entry
            #expect(entry?.body.starts(with: Array("k\(key.dropFirst(4))|".utf8)) == true, "\(key)")
        }
    }

    @Test func persisted() throws {
        var template = Array("/tmp/fetchq-cache-XXXXXX".utf8CString)
        guard let made = template.withUnsafeMutableBufferPointer({ mkdtemp($0.baseAddress!) })
        else {
            throw FetchQError(.store, "mkdtemp failed: errno \(errno)")
        }
        let dir = String(cString: made)
        let path = dir + "/cache.sqlite"
        defer {
            for suffix in ["", "-wal", "-shm"] { unlink(path + suffix) }
            rmdir(dir)
        }
        do {
            let cache = try HTTPCache(maxBytes: 6_000, persistPath: path)
            let (problems, lookups) = Self.hammer(cache, operations: 300)
            #expect(problems.isEmpty, "\(problems.prefix(5))")
            #expect(cache.consistencyProblems() == [])
            #expect(cache.persistenceError == nil)
            let stats = cache.statistics
            #expect(stats.hits + stats.misses == lookups)
            #expect(stats.evictions > 0)
        }
        // The file holds what fits, and every row is intact.
        let reopened = try HTTPCache(maxBytes: 1 << 20, persistPath: path)
        let stats = reopened.statistics
        #expect(stats.bytes <= 6_000)
        #expect(stats.entries > 0)
        var found = 0
        for key in 0..<Self.keys {
            if let entry = reopened.lookup("key-\(key)", now: Self.t0).entry {
                found += 1
                #expect(entry.body.starts(with: Array("k\(key)|".utf8)))
            }
        }
        #expect(found == stats.entries)
    }
}
