import CJansson
@testable import FetchQ
import Glibc
import Synchronization
import Testing

/// The engine's HTTP cache against the test server's cache routes, whose
/// bodies carry a per-key request count (a cached body shows an old count).
@Suite(.serialized) struct EngineCacheTests {
    let server: TestServer
    init() throws { server = try TestServer() }

    func serverCount(_ path: String) throws -> Int64 {
        let (_, body) = try server.get("/stats")
        return try JSONParser.parse(body, maxDepth: 64).at("/by_path/\(path.replacingSlash())")?.integerValue ?? 0
    }

    @Test func freshEntriesAnswerWithoutARequest() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=fresh")
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            let second = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.fromCache == false)
            #expect(second.fromCache == true)
            #expect(second.outcome == .succeeded)
            #expect(second.http?.status == 200)
            #expect(second.value?.at("/count")?.integerValue == 1)
            #expect(second.http?.metrics?.at("/from_cache")?.boolValue == true)
            #expect(engine.stats().at("/cache/hits")?.integerValue == 1)
        }
        #expect(try serverCount("/cache") == 1)
    }

    @Test func staleEntriesAreRevalidatedAndA304KeepsTheBody() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let url = server.url("/etag?key=reval")  // max-age=0 with an ETag
            let first = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            let second = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
            #expect(first.value?.at("/count")?.integerValue == 1)
            #expect(second.outcome == .succeeded)
            #expect(second.http?.status == 200)
            #expect(second.fromCache == true)
            // The server answered 304 to the second: the body is the first one's.
            #expect(second.value?.at("/count")?.integerValue == 1)
        }
        #expect(try serverCount("/etag") == 2)
    }

    @Test func noStoreReloadAndOnlyIfCached() throws {
        _ = try server.get("/stats/reset")
        try withEngine { engine, queue, c in
            let noStore = server.url("/cache?max_age=60&no_store=1&key=ns")
            _ = c.wait(try engine.request(#"{"url": "\#(noStore)"}"#, on: queue, c))
            let again = try #require(c.wait(try engine.request(#"{"url": "\#(noStore)"}"#, on: queue, c)))
            #expect(again.fromCache == false)
            #expect(again.value?.at("/count")?.integerValue == 2)

            let cached = server.url("/cache?max_age=60&key=rl")
            let miss = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(miss.outcome == .failed)
            #expect(miss.status == .cacheMiss)
            _ = c.wait(try engine.request(#"{"url": "\#(cached)"}"#, on: queue, c))
            let reload = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "reload"}"#, on: queue, c)))
            #expect(reload.fromCache == false)
            #expect(reload.value?.at("/count")?.integerValue == 2)
            let hit = try #require(c.wait(try engine.request(#"{"url": "\#(cached)"}"#, options: #"{"cache": "only-if-cached"}"#, on: queue, c)))
            #expect(hit.fromCache == true)
            #expect(hit.value?.at("/count")?.integerValue == 2)  // the reload refreshed the entry
        }
        #expect(try serverCount("/cache") == 4)
    }

    @Test func staleWhileRevalidateDeliversTheCachedValueFirst() throws {
        try withEngine { engine, queue, c in
            let url = server.url("/cache?max_age=0&key=swr")
            _ = c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))
            let id = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "stale-while-revalidate"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            let updates = c.allEvents.filter { $0.id == id && $0.kind == .update }
            #expect(updates.count == 1)
            #expect(updates.first?.child?.fromCache == true)
            #expect(updates.first?.child?.value?.at("/count")?.integerValue == 1)
            #expect(r.outcome == .succeeded)
            let log = c.deliveryLog
            #expect(log.firstIndex(of: "event \(id)")! < log.firstIndex(of: "done \(id)")!)
        }
    }

    @Test func staleWhileRevalidateKeepsTheStaleValueWhenTheRefreshFails() throws {
        var url = ""
        try withEngine { engine, queue, c in
            do {
                let doomed = try TestServer()
                url = doomed.url("/cache?max_age=0&key=gone")
                #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.outcome == .succeeded)
            }  // the server is stopped here
            let id = try engine.request(#"{"url": "\#(url)"}"#, options: #"{"cache": "stale-while-revalidate"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .failed)
            #expect(r.status == .network)
            #expect(r.value?.at("/key")?.stringValue == "gone")
            #expect(c.allEvents.contains { $0.id == id && $0.kind == .update })
        }
    }

    @Test func searchesUseTheSameCache() throws {
        _ = try server.get("/stats/reset")
        let config = #"{"search": {"url": "\#(server.url("/search?q={query}&rpp=500&max_age=60"))", "results": "/results"}}"#
        try withEngine(config) { engine, queue, c in
            let first = try #require(c.wait(try engine.search("swift", on: queue, c)))
            let second = try #require(c.wait(try engine.search("swift", on: queue, c)))
            #expect(second.fromCache == true)
            #expect(second.value?.at("/count")?.integerValue == first.value?.at("/count")?.integerValue)
        }
        #expect(try serverCount("/search") == 1)
    }

    @Test func cacheCanBeTurnedOffAndPersisted() throws {
        _ = try server.get("/stats/reset")
        try withEngine(#"{"cache": {"max_bytes": 0}}"#) { engine, queue, c in
            let url = server.url("/cache?max_age=60&key=off")
            _ = c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))
            #expect(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c))?.fromCache == false)
            #expect(engine.stats().at("/cache") == nil)
        }
        var template = Array("/tmp/fetchq-cache-XXXXXX".utf8CString)
        let dir = String(cString: try #require(template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }))
        defer {
            for s in ["", "-wal", "-shm"] { unlink(dir + "/c.db" + s) }
            rmdir(dir)
        }
        let url = server.url("/cache?max_age=60&key=persist")
        for round in 0..<2 {
            try withEngine(#"{"cache": {"path": "\#(dir)/c.db"}}"#) { engine, queue, c in
                let r = try #require(c.wait(try engine.request(#"{"url": "\#(url)"}"#, on: queue, c)))
                #expect(r.fromCache == (round == 1), "round \(round)")
            }
        }
    }

    @Test func fetchqLogSelectsTheDefaultLevel() throws {
        // The mapping of FETCHQ_LOG (not setenv: other suites run in parallel).
        #expect(LogLevelName.level(fromEnvironment: "debug") == "debug")
        #expect(LogLevelName.level(fromEnvironment: "TRACE") == "trace")
        #expect(LogLevelName.level(fromEnvironment: "off") == "off")
        #expect(LogLevelName.level(fromEnvironment: "nonsense") == "warning")
        #expect(LogLevelName.level(fromEnvironment: nil) == "warning")
        // An explicit "log" key wins over the environment's default.
        let explicit = json(#"{"log": "error"}"#)
        #expect(try withExtendedLifetime(explicit) { try EngineConfig(json: explicit.pointer) }.log == "error")
    }

    @Test func logLinesReachTheCallbackAtTheConfiguredLevel() throws {
        let lines = Mutex<[String]>([])
        try withEngine(#"{"log": "info"}"#) { engine, queue, c in
            engine.setLogCallback { level, line in lines.withLock { $0.append("\(level) \(line)") } }
            let id = try engine.request(#"{"url": "\#(server.url("/status/503"))"}"#, on: queue, c)
            _ = c.wait(id)
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
        }
        let logged = lines.withLock { $0 }
        #expect(logged.contains { $0.hasPrefix("info operation failed") && $0.contains("status=http") })
        #expect(logged.contains { $0.hasPrefix("info engine shutting down") })
        // Above the level: nothing.
        let quiet = Mutex<Int>(0)
        try withEngine(#"{"log": "error"}"#) { engine, queue, c in
            engine.setLogCallback { _, _ in quiet.withLock { $0 += 1 } }
            _ = c.wait(try engine.request(#"{"url": "\#(server.url("/status/503"))"}"#, on: queue, c))
        }
        #expect(quiet.withLock { $0 } == 0)
        let loud = json(#"{"log": "loud"}"#)
        #expect(throws: FetchQError.self) { _ = try withExtendedLifetime(loud) { try Engine(json: loud.pointer) } }
    }
}
