import FetchQ
import Glibc
import Synchronization
import Testing

/// Cancellation, connection reuse, concurrency, progress, shutdown, and the
/// exactly-once completion guarantee.
@Suite("Transport: lifecycle")
struct TransportLifecycleTests {
    let server: TestServer

    init() throws {
        server = try TestServer()
    }

    // MARK: Cancel

    @Test("cancel in flight: .cancelled promptly, and the connection is closed")
    func cancelInFlight() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        let box = TestCollector<TransportResult>()
        let id = transport.start(HTTPRequest(url: server.url("/stall")), progress: nil) { box.add($0) }
        // The request reached the server and is waiting there.
        let stalled = try server.waitForStats { $0["in_flight"] == 1 && $0["open_connections"] == 1 }
        #expect(stalled != nil)
        #expect(transport.activeTransfers == 1)

        transport.cancel(id)
        let error = try #require(box.waitFirst(timeout: 5)?.error)
        #expect(error.kind == .cancelled)
        #expect(error.curlCode == 0)
        #expect(transport.activeTransfers == 0)
        // curl closed the connection: the server sees it go away.
        let closed = try server.waitForStats { $0["open_connections"] == 0 && $0["in_flight"] == 0 }
        #expect(closed != nil)

        transport.shutdown()
        #expect(box.count == 1)
    }

    @Test("cancel right after start, twice, after completion, and of unknown ids: one completion each")
    func cancelEdgeCases() throws {
        let transport = try CurlTransport()
        let early = TestCollector<TransportResult>()
        let id = transport.start(HTTPRequest(url: server.url("/stall")), progress: nil) { early.add($0) }
        transport.cancel(id)
        transport.cancel(id)
        transport.cancel(TransferID(rawValue: 987_654_321))
        #expect(try #require(early.waitFirst(timeout: 5)).error?.kind == .cancelled)

        let done = TestCollector<TransportResult>()
        let doneID = transport.start(HTTPRequest(url: server.url("/json?size=10")), progress: nil) { done.add($0) }
        #expect(try #require(done.waitFirst(timeout: 10)).response?.status == 200)
        transport.cancel(doneID)
        transport.cancel(id)

        transport.shutdown()  // joins the loop: nothing can arrive after this
        #expect(early.count == 1)
        #expect(done.count == 1)
        #expect(transport.activeTransfers == 0)
    }

    @Test("the loop reports its turns: a sleep when idle, and its exit once, last")
    func loopTurns() throws {
        let turns = TestCollector<LoopTurn>()
        let transport = try CurlTransport(onTurn: { turns.add($0) })
        #expect(try transport.perform(HTTPRequest(url: server.url("/json?size=10"))).get().status == 200)
        var asleep = false
        for _ in 0..<500 where !asleep {  // bounded: 5 s
            usleep(10_000)
            asleep = turns.all.last == .sleeping
        }
        #expect(asleep)
        #expect(turns.all.contains(.woke))
        #expect(!turns.all.contains(.exiting))
        transport.shutdown()
        #expect(turns.all.last == .exiting)
        #expect(turns.all.filter { $0 == .exiting }.count == 1)
    }

    // MARK: Connections

    @Test("20 sequential GETs reuse one connection")
    func connectionReuse() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        try server.resetStats()
        var reused: [Bool] = []
        for _ in 0..<20 {
            let response = try transport.perform(HTTPRequest(url: server.url("/json?size=200"))).get()
            #expect(response.status == 200)
            reused.append(response.metrics.reusedConnection)
        }
        #expect(reused.first == false)
        #expect(reused.dropFirst().allSatisfy { $0 })
        let stats = try server.stats()
        #expect(stats["requests"] == 20)
        #expect(stats["connections_total"] == 1)
    }

    @Test("connections opened by a burst stay open while the load drops to one transfer at a time")
    func connectionsSurviveADrain() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        try server.resetStats()
        func burst() throws {
            let box = TestCollector<TransportResult>()
            for i in 0..<8 {
                _ = transport.start(HTTPRequest(url: server.url("/delay?ms=100&i=\(i)")), progress: nil) { box.add($0) }
            }
            let results = try #require(box.wait(for: 8, timeout: 30))
            #expect(results.allSatisfy { $0.response?.status == 200 })
        }
        try burst()
        #expect(try server.stats()["connections_total"] == 8)
        // One at a time: curl's default cache limit (4 x the transfers in the
        // multi handle, so 4 here) would close the idle connections one by one.
        for _ in 0..<6 {
            #expect(try transport.perform(HTTPRequest(url: server.url("/json?size=10"))).get().status == 200)
        }
        try burst()
        let stats = try server.stats()
        #expect(stats["requests"] == 22)
        #expect(stats["connections_total"] == 8)
    }

    @Test("a start racing the loop's way to sleep is never left waiting for the poll timeout")
    func noLostWakeups() throws {
        // Each start is made right after the previous completion, while the loop
        // thread is between its last check of the inbox and curl_multi_poll. A
        // lost wakeup would stall that request until the poll times out (no
        // other socket is active to wake it). The loop here sleeps up to 30 s,
        // so a lost wakeup is a stall of many seconds, which no scheduling
        // delay on a busy machine explains; a thread stops at its first one.
        let transport = try CurlTransport(maxSleepMs: 30_000)
        defer { transport.shutdown() }
        let server = self.server
        @Sendable func monotonicSeconds() -> Double {
            var ts = timespec()
            clock_gettime(CLOCK_MONOTONIC, &ts)
            return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
        }
        // (thread, requests answered 200, requests that stalled)
        let results = TestCollector<(Int, Int, Int)>()
        runThreads(3) { index in
            var ok = 0
            var stalled = 0
            for i in 0..<150 {
                let start = monotonicSeconds()
                let status = try? transport.perform(HTTPRequest(url: server.url("/json?size=10&t=\(index)&i=\(i)")))
                    .get().status
                if status == 200 { ok += 1 }
                if monotonicSeconds() - start >= 10 { stalled += 1; break }
            }
            results.add((index, ok, stalled))
        }
        for (index, ok, stalled) in results.all {
            #expect(stalled == 0, "thread \(index): a request waited for the poll's timeout")
            #expect(ok == 150, "thread \(index)")
        }
        #expect(results.count == 3)
    }

    @Test("100 concurrent GETs all complete exactly once")
    func hundredConcurrent() throws {
        let transport = try CurlTransport()
        try server.resetStats()
        let box = TestCollector<(Int, TransportResult)>()
        var ids: [TransferID] = []
        for i in 0..<100 {
            ids.append(transport.start(HTTPRequest(url: server.url("/delay?ms=20&i=\(i)")), progress: nil) {
                box.add((i, $0))
            })
        }
        let results = try #require(box.wait(for: 100, timeout: 60))
        transport.shutdown()
        #expect(box.count == 100)
        #expect(Set(ids).count == 100)
        #expect(Set(results.map(\.0)) == Set(0..<100))
        #expect(results.allSatisfy { $0.1.response?.status == 200 })
        #expect(transport.activeTransfers == 0)
        let stats = try server.stats()
        #expect(stats["requests"] == 100)
        #expect((stats["max_in_flight"] ?? 0) > 1)  // they really ran concurrently
    }

    @Test("a second burst of 64 concurrent GETs reuses the first burst's 64 easy handles")
    func burstsReuseEasyHandles() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        try server.resetStats()
        for burst in 1...2 {
            let box = TestCollector<TransportResult>()
            for i in 0..<64 {
                _ = transport.start(HTTPRequest(url: server.url("/delay?ms=200&b=\(burst)&i=\(i)")), progress: nil) {
                    box.add($0)
                }
            }
            let results = try #require(box.wait(for: 64, timeout: 60))
            #expect(results.allSatisfy { $0.response?.status == 200 })
        }
        #expect((try server.stats()["max_in_flight"] ?? 0) > 32)  // more at once than the old fixed pool of 32
        // One handle per transfer of the first burst; the second burst made
        // none (with at most 32 kept idle it made 32 more).
        #expect(transport.easyHandlesMade == 64)
    }

    @Test("a stalled request does not hold up others to the same host", arguments: [false, true])
    func stallDoesNotBlockHost(tls: Bool) throws {
        let server = tls ? try TestServer(tls: true) : self.server
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        let stall = TestCollector<TransportResult>()
        _ = transport.start(HTTPRequest(url: server.url("/stall"), caFile: server.certificateFile), progress: nil) {
            stall.add($0)
        }
        _ = try server.waitForStats { $0["in_flight"] == 1 }
        let response = try transport.perform(
            HTTPRequest(url: server.url("/json?size=10"), caFile: server.certificateFile), timeout: 10).get()
        #expect(response.status == 200)
        #expect(stall.count == 0)
    }

    @Test("maxTotalConnections bounds what the server sees")
    func connectionLimit() throws {
        let transport = try CurlTransport(maxTotalConnections: 3)
        defer { transport.shutdown() }
        try server.resetStats()
        let box = TestCollector<TransportResult>()
        for _ in 0..<12 {
            _ = transport.start(HTTPRequest(url: server.url("/delay?ms=50")), progress: nil) { box.add($0) }
        }
        let results = try #require(box.wait(for: 12, timeout: 60))
        #expect(results.allSatisfy { $0.response?.status == 200 })
        let stats = try server.stats()
        #expect((stats["max_in_flight"] ?? 99) <= 3)
        #expect((stats["connections_total"] ?? 99) <= 3)
    }

    // MARK: Progress

    @Test("progress reports increasing byte counts up to the total, on the loop thread")
    func progress() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        let reports = TestCollector<(UInt64, UInt64, pthread_t)>()
        let box = TestCollector<(TransportResult, pthread_t)>()
        _ = transport.start(
            HTTPRequest(url: server.url("/drip?bytes=2000&chunk=200&interval_ms=20"), progressIntervalMs: 0),
            progress: { reports.add(($0, $1, pthread_self())) },
            completion: { box.add(($0, pthread_self())) })
        let (result, completionThread) = try #require(box.waitFirst(timeout: 20))
        #expect(try result.get().body.count == 2000)
        let values = reports.all
        #expect(values.count >= 2)
        #expect(zip(values, values.dropFirst()).allSatisfy { $0.0 < $1.0 })
        #expect(values.last?.0 == 2000)
        #expect(values.allSatisfy { $0.1 == 2000 })
        #expect(values.allSatisfy { pthread_equal($0.2, completionThread) != 0 })
    }

    // MARK: Shutdown and re-entrancy

    @Test("shutdown with transfers in flight completes every one exactly once")
    func shutdownInFlight() throws {
        let transport = try CurlTransport()
        let box = TestCollector<(Int, TransportResult)>()
        var n = 0
        for path in ["/stall", "/stall", "/delay?ms=30000", "/drip?bytes=100000&chunk=10&interval_ms=500"] {
            for _ in 0..<3 {
                let i = n
                _ = transport.start(HTTPRequest(url: server.url(path)), progress: nil) { box.add((i, $0)) }
                n += 1
            }
        }
        _ = try server.waitForStats { $0["in_flight"] == n }
        transport.shutdown()
        let results = box.all
        #expect(results.count == n)
        #expect(Set(results.map(\.0)).count == n)
        #expect(results.allSatisfy { $0.1.error?.kind == .cancelled })
        #expect(transport.activeTransfers == 0)

        // After shutdown: completes at once, on the caller's thread, with .cancelled.
        let late = TestCollector<TransportResult>()
        _ = transport.start(HTTPRequest(url: server.url("/json")), progress: nil) { late.add($0) }
        #expect(late.count == 1)
        #expect(late.all.first?.error?.kind == .cancelled)
        transport.shutdown()  // idempotent
        transport.cancel(TransferID(rawValue: 1))
        #expect(late.count == 1)
        #expect(try server.waitForStats { $0["open_connections"] == 0 } != nil)
    }

    @Test("a transport dropped without shutdown cancels its transfers")
    func deinitCancels() throws {
        let box = TestCollector<TransportResult>()
        do {
            let transport = try CurlTransport()
            _ = transport.start(HTTPRequest(url: server.url("/stall")), progress: nil) { box.add($0) }
            _ = try server.waitForStats { $0["in_flight"] == 1 }
        }
        #expect(try #require(box.waitFirst(timeout: 10)).error?.kind == .cancelled)
    }

    @Test("completions may start and cancel transfers")
    func reentrantCompletion() throws {
        let transport = try CurlTransport()
        defer { transport.shutdown() }
        let box = TestCollector<String>()
        let url = server.url("/json?size=10")
        let stallURL = server.url("/stall")
        _ = transport.start(HTTPRequest(url: url), progress: nil) { first in
            box.add("first \(first.response?.status ?? 0)")
            let stall = transport.start(HTTPRequest(url: stallURL), progress: nil) { box.add("stall \($0.error?.kind == .cancelled)") }
            _ = transport.start(HTTPRequest(url: url), progress: nil) { second in
                box.add("second \(second.response?.status ?? 0)")
                transport.cancel(stall)
            }
        }
        let events = try #require(box.wait(for: 3, timeout: 20))
        #expect(events == ["first 200", "second 200", "stall true"])
    }

    @Test("shutdown from inside a completion does not deadlock")
    func shutdownFromCompletion() throws {
        let transport = try CurlTransport()
        let box = TestCollector<String>()
        _ = transport.start(HTTPRequest(url: server.url("/stall")), progress: nil) { box.add("stall \($0.error?.kind == .cancelled)") }
        _ = transport.start(HTTPRequest(url: server.url("/json?size=10")), progress: nil) { _ in
            transport.shutdown()  // on the loop thread: returns without waiting
            box.add("shutdown returned")
        }
        let events = box.wait(for: 2, timeout: 20)
        #expect(events == ["shutdown returned", "stall true"], "\(box.all)")
        transport.shutdown()  // joins
        #expect(box.count == 2)
    }
}
