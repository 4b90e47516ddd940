import CJansson
@testable import FetchQ
import Glibc
import Testing

/// Retries, rate limits and request coalescing through the engine, verified
/// from the test server's side where it can see them.
@Suite(.serialized) struct EngineResilienceTests {
    let server: TestServer
    init() throws { server = try TestServer() }

    func stats() throws -> JSONRef {
        let (_, body) = try server.get("/stats")
        return try JSONParser.parse(body, maxDepth: 64)
    }

    func requests(to path: String) throws -> Int64 { try stats().at("/by_path/\(path.replacingSlash())")?.integerValue ?? 0 }

    func resetStats() throws { _ = try server.get("/stats/reset") }

    /// Polls the server (at most 2 s) until it holds exactly one request; stops
    /// as soon as it does, so that the caller acts while that request is in flight.
    func waitForOneInFlight() throws -> Bool {
        for _ in 0..<200 {
            if try stats().at("/in_flight")?.integerValue == 1 { return true }
            usleep(10_000)
        }
        return false
    }

    /// The paths of the requests the server received, in arrival order.
    func arrivals() throws -> [String] { try stats().at("/arrivals")?.elements.compactMap(\.stringValue) ?? [] }

    func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = monotonicNanos()
        try body()
        return Double(monotonicNanos() - start) / 1e9
    }

    // MARK: retries

    @Test func retriesUntilSuccessAndCountsAttempts() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/flaky?key=r1&fail=2"))"}"#,
                                        options: #"{"retry": {"max": 3, "base": 0.01}}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            #expect(r.http?.metrics?.at("/attempts")?.integerValue == 3)
            #expect(r.value?.at("/attempt")?.integerValue == 3)
        }
        #expect(try requests(to: "/flaky") == 3)
    }

    @Test func givesUpAfterMaxAndKeepsTheLastResponse() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/flaky?key=r2&fail=9&status=502"))"}"#,
                                        options: #"{"retry": {"max": 2, "base": 0.01}}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .failed)
            #expect(r.status == .http)
            #expect(r.http?.status == 502)
            #expect(r.http?.metrics?.at("/attempts")?.integerValue == 3)
        }
        #expect(try requests(to: "/flaky") == 3)
    }

    @Test func backoffDelaysAreWaited() throws {
        try withEngine { engine, queue, c in
            // Delays: 0.2 * [0.5, 1] then 0.4 * [0.5, 1] -> at least 0.3 s in all.
            // Each delay's bounds (jitter and cap) are checked without a clock
            // in NetworkResultTests.backoffStaysWithinItsJitterAndCap.
            var r: OperationResult?
            let elapsed = try seconds {
                let id = try engine.request(#"{"url": "\#(server.url("/flaky?key=r3&fail=2"))"}"#,
                                            options: #"{"retry": {"max": 2, "base": 0.2, "max_delay": 10}}"#, on: queue, c)
                r = c.wait(id)
            }
            #expect(r?.outcome == .succeeded)
            #expect(elapsed >= 0.3)
            #expect(elapsed < 10)  // generous: fails instead of hanging
        }
    }

    @Test(arguments: [false, true]) func honoursRetryAfter(httpDate: Bool) throws {
        try withEngine { engine, queue, c in
            var r: OperationResult?
            let key = httpDate ? "ra-date" : "ra-seconds"
            let url = server.url("/retry-after?key=\(key)&fail=1&after=2&date=\(httpDate ? 1 : 0)")
            let elapsed = try seconds {
                let id = try engine.request(#"{"url": "\#(url)"}"#,
                                            options: #"{"retry": {"max": 1, "base": 0.01}}"#, on: queue, c)
                r = c.wait(id)
            }
            #expect(r?.outcome == .succeeded)
            #expect(r?.http?.metrics?.at("/attempts")?.integerValue == 2)
            // An HTTP-date has one-second resolution: at least 1 s either way.
            #expect(elapsed >= 1.0)
        }
    }

    /// The first of two coalesced callers is cancelled while the transfer
    /// waits out a Retry-After: the other's transfer still waits it out (it
    /// was retried at once) and goes on counting attempts (it said 1).
    @Test func aCarrierWaitsOutTheRetryAfterOfTheCallerItReplaces() throws {
        try withEngine { engine, queue, c in
            let url = server.url("/retry-after?key=carried&fail=1&after=2")
            let options = #"{"retry": {"max": 2, "base": 0.01}}"#
            let first = try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)
            let second = try engine.request(#"{"url": "\#(url)"}"#, options: options, on: queue, c)
            // Wait for the 429: the transfer then waits to retry.
            let deadline = monotonicNanos() + 10_000_000_000
            while try requests(to: "/retry-after") < 1 && monotonicNanos() < deadline { usleep(10_000) }
            usleep(100_000)
            var r: OperationResult?
            let elapsed = try seconds {
                try engine.cancel(first)
                r = c.wait(second)
            }
            #expect(c.wait(first)?.outcome == .cancelled)
            #expect(r?.outcome == .succeeded)
            #expect(r?.http?.metrics?.at("/attempts")?.integerValue == 2)
            #expect(elapsed >= 1.5, "retried after \(elapsed) s, Retry-After said 2")
            #expect(try requests(to: "/retry-after") == 2)
        }
    }

    @Test func postIsNotRetriedUnlessAsked() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let plain = try engine.request(#"{"method": "POST", "url": "\#(server.url("/flaky?key=p1&fail=1"))", "body": "x"}"#,
                                           options: #"{"retry": {"max": 3, "base": 0.01}}"#, on: queue, c)
            #expect(c.wait(plain)?.status == .http)
            #expect(try requests(to: "/flaky") == 1)
            let asked = try engine.request(#"{"method": "POST", "url": "\#(server.url("/flaky?key=p2&fail=1"))", "body": "x"}"#,
                                           options: #"{"retry": {"max": 3, "base": 0.01, "any_method": true}}"#, on: queue, c)
            #expect(c.wait(asked)?.outcome == .succeeded)
        }
    }

    @Test func networkErrorsAreRetriedWhenListed() throws {
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/reset"))"}"#,
                                        options: #"{"retry": {"max": 2, "base": 0.01, "on": ["network"]}}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.status == .network)
            #expect(r.http?.metrics?.at("/attempts")?.integerValue == 3)
            let notListed = try engine.request(#"{"url": "\#(server.url("/reset"))"}"#,
                                               options: #"{"retry": {"max": 2, "base": 0.01, "on": [503]}}"#, on: queue, c)
            #expect(c.wait(notListed)?.http?.metrics?.at("/attempts")?.integerValue == 1)
        }
    }

    @Test func backoffReleasesTheSlotAndCancelEndsItAtOnce() throws {
        try withEngine(queue: 1) { engine, queue, c in
            let slow = try engine.request(#"{"url": "\#(server.url("/flaky?key=b1&fail=1"))"}"#,
                                          options: #"{"retry": {"max": 1, "base": 30, "max_delay": 30}}"#, on: queue, c)
            let other = try engine.request(#"{"url": "\#(server.url("/json"))"}"#, on: queue, c)
            // With max_concurrent 1, `other` can only finish if the backing-off op gave its slot up.
            #expect(c.wait(other, timeoutMs: 10_000)?.outcome == .succeeded)
            #expect(c.count == 1)
            var r: OperationResult?
            let elapsed = try seconds {
                try engine.cancel(slow)
                r = c.wait(slow, timeoutMs: 5000)
            }
            #expect(r?.outcome == .cancelled)
            #expect(elapsed < 5)
        }
    }

    @Test func badRetryOptionsFailAtSubmit() throws {
        try withEngine { engine, queue, c in
            for retry in [#"{"max": -1}"#, #"{"max": 3, "on": ["sometimes"]}"#, #"{"maxx": 3}"#, #"{"base": "1s"}"#] {
                #expect(throws: FetchQError.self, "\(retry)") {
                    _ = try engine.request(#"{"url": "\#(server.url("/json"))"}"#, options: #"{"retry": \#(retry)}"#, on: queue, c)
                }
            }
        }
    }

    // MARK: rate limits

    @Test func rateLimitSpacesStartsWithoutBlockingOtherHosts() throws {
        let limited = "127.0.0.1:\(server.port)"
        try withEngine(#"{"rate_limits": {"\#(limited)": {"per_second": 10, "burst": 1}}, "max_per_host": 16}"#, queue: 16) { engine, queue, c in
            var ids: [OpID] = []
            var other: OpID = 0
            let elapsed = try seconds {
                for i in 0..<6 { ids.append(try engine.request(#"{"url": "\#(server.url("/echo?n=\(i)"))"}"#, on: queue, c)) }
                // The same server under another host name is not limited.
                other = try engine.request(#"{"url": "http://localhost:\#(server.port)/echo?other=1"}"#, on: queue, c)
                #expect(c.waitAll(ids) != nil)
            }
            // 1 at once, then one every 100 ms: the 6th starts >= 0.5 s after the first.
            #expect(elapsed >= 0.5)
            let order = c.completionOrder
            #expect(order.firstIndex(of: other)! < order.firstIndex(of: ids.last!)!)
        }
    }

    // MARK: coalescing

    @Test func identicalGETsShareOneTransfer() throws {
        try resetStats()
        try withEngine(#"{"max_per_host": 6}"#, queue: 100) { engine, queue, c in
            var ids: [OpID] = []
            for _ in 0..<100 { ids.append(try engine.request(#"{"url": "\#(server.url("/delay?ms=300"))"}"#, on: queue, c)) }
            let results = try #require(c.waitAll(ids))
            #expect(results.count == 100)
            #expect(results.allSatisfy { $0.outcome == .succeeded && $0.value?.at("/delayed")?.integerValue == 300 })
            #expect(Set(results.map(\.id)).count == 100)
            #expect(c.duplicates.isEmpty)
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(engine.stats().at("/succeeded")?.integerValue == 100)
        }
        #expect(try requests(to: "/delay") == 1)
    }

    @Test func cancellingOneCallerDetachesOnlyIt() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let a = try engine.request(#"{"url": "\#(server.url("/delay?ms=400"))"}"#, on: queue, c)
            let b = try engine.request(#"{"url": "\#(server.url("/delay?ms=400"))"}"#, on: queue, c)
            let d = try engine.request(#"{"url": "\#(server.url("/delay?ms=400"))"}"#, on: queue, c)
            try engine.cancel(b)
            #expect(c.wait(b, timeoutMs: 2000)?.outcome == .cancelled)
            #expect(c.wait(a)?.outcome == .succeeded)
            #expect(c.wait(d)?.outcome == .succeeded)
            try engine.cancel(b)  // cancelled already: harmless (FQ_OK)
        }
        #expect(try requests(to: "/delay") == 1)
    }

    /// Two identical GETs of `path`, once the server has their one request.
    func twoCallersInFlight(_ path: String, _ engine: Engine, _ queue: Queue, _ c: Completions) throws -> (OpID, OpID) {
        let a = try engine.request(#"{"url": "\#(server.url(path))"}"#, on: queue, c)
        let b = try engine.request(#"{"url": "\#(server.url(path))"}"#, on: queue, c)
        #expect(try waitForOneInFlight())
        return (a, b)
    }

    @Test func theTransferIsCancelledWhenTheLastCallerCancels() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let (a, b) = try twoCallersInFlight("/stall", engine, queue, c)
            try engine.cancel(a)
            #expect(c.wait(a, timeoutMs: 2000)?.outcome == .cancelled)
            #expect(try stats().at("/in_flight")?.integerValue == 1)  // b still holds it
            try engine.cancel(b)
            #expect(c.wait(b, timeoutMs: 2000)?.outcome == .cancelled)
            var closed = false
            for _ in 0..<100 {
                if try stats().at("/open_connections")?.integerValue == 0 { closed = true; break }
                usleep(50_000)
            }
            #expect(closed)
        }
    }

    @Test func theSharedTransferRunsAtTheHighestCallersPriority() throws {
        try resetStats()
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let normal = try engine.request(#"{"url": "\#(server.url("/echo?n=1"))"}"#, on: queue, c)
            let low = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "low"}"#, on: queue, c)
            let high = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "very-high"}"#, on: queue, c)
            queue.setSuspended(false)
            #expect(c.waitAll([normal, low, high]) != nil)
        }
        #expect(try arrivals() == ["/echo?n=2", "/echo?n=1"])
    }

    @Test func aCancelledLeaderLeavesItsRunningTransferToTheOthers() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let (a, b) = try twoCallersInFlight("/delay?ms=400", engine, queue, c)
            try engine.cancel(a)
            #expect(c.wait(a, timeoutMs: 2000)?.outcome == .cancelled)
            let rb = try #require(c.wait(b))
            #expect(rb.outcome == .succeeded)
            #expect(rb.value?.at("/delayed")?.integerValue == 400)
            // a ended at its cancel, not when the transfer did.
            #expect(c.completionOrder == [a, b])
            try engine.cancel(a)  // cancelled already: harmless
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(engine.stats().at("/succeeded")?.integerValue == 1)
            #expect(engine.stats().at("/cancelled")?.integerValue == 1)
            #expect(engine.stats().at("/running")?.integerValue == 0)
        }
        #expect(try requests(to: "/delay") == 1)  // not sent again
    }

    @Test func aTransferHandedOverIsStillRetried() throws {
        try resetStats()
        let key = "handed-\(monotonicNanos())"
        try withEngine { engine, queue, c in
            let url = #"{"url": "\#(server.url("/flaky?key=\(key)&fail=1&ms=300"))"}"#
            let retry = #"{"retry": {"max": 2, "base": 0.01}}"#
            let a = try engine.request(url, options: retry, on: queue, c)
            let b = try engine.request(url, options: retry, on: queue, c)
            #expect(try waitForOneInFlight())
            try engine.cancel(a)  // while the first attempt (a 503) is on its way
            #expect(c.wait(a, timeoutMs: 2000)?.outcome == .cancelled)
            let rb = try #require(c.wait(b))
            #expect(rb.outcome == .succeeded)
            #expect(rb.http?.status == 200)
            #expect(rb.value?.at("/attempt")?.integerValue == 2)
            #expect(rb.http?.metrics?.at("/attempts")?.integerValue == 2)
            #expect(c.completionOrder == [a, b])
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(engine.stats().at("/running")?.integerValue == 0)
        }
        #expect(try requests(to: "/flaky") == 2)
    }

    @Test func aLeaderCannotLowerItsTransferBelowItsCallers() throws {
        try resetStats()
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let normal = try engine.request(#"{"url": "\#(server.url("/echo?n=1"))"}"#, on: queue, c)
            let leader = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, on: queue, c)
            let high = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "high"}"#, on: queue, c)
            try engine.setPriority(leader, .veryLow)  // its own; the transfer stays at high for `high`
            queue.setSuspended(false)
            #expect(c.waitAll([normal, leader, high]) != nil)
        }
        #expect(try arrivals() == ["/echo?n=2", "/echo?n=1"])
    }

    @Test func aLeaderThatLoweredItselfIsLiftedByALaterCaller() throws {
        try resetStats()
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let leader = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "high"}"#, on: queue, c)
            try engine.setPriority(leader, .veryLow)
            let normal = try engine.request(#"{"url": "\#(server.url("/echo?n=1"))"}"#, on: queue, c)
            let caller = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "high"}"#, on: queue, c)
            queue.setSuspended(false)
            #expect(c.waitAll([leader, normal, caller]) != nil)
        }
        #expect(try arrivals() == ["/echo?n=2", "/echo?n=1"])
    }

    /// A leader cancelled while its transfer runs for others hands it to an
    /// internal carrier, which holds the slot but has no callback:
    /// "undelivered" went to -1 for each such carrier (a poll mode soak review
    /// saw -1 to -6). Nor is it counted in "running": its callers count as
    /// queued, and the stats add up (the scenario review of the twenty-ninth
    /// session found one too many).
    @Test func aRunningCarrierIsNotCountedAgainstUndelivered() throws {
        try withEngine(queue: 1) { engine, queue, c in
            let url = #"{"url": "\#(server.url("/delay?ms=1500"))"}"#
            let leader = try engine.request(url, on: queue, c)
            let callers = try (0..<2).map { _ in try engine.request(url, on: queue, c) }
            usleep(100_000)  // the leader's transfer runs
            try engine.cancel(leader)
            #expect(c.wait(leader)?.outcome == .cancelled)
            // The leader's callback was recorded; it counts as undelivered
            // until it has returned: wait (bounded) for that.
            var stats = engine.stats()
            for _ in 0..<200 where stats.at("/undelivered")?.integerValue != 0 {
                #expect((stats.at("/undelivered")?.integerValue ?? -1) >= 0)
                usleep(2_000)
                stats = engine.stats()
            }
            #expect(stats.at("/running")?.integerValue == 0)  // the carrier is internal
            #expect(stats.at("/queued")?.integerValue == 2)   // the callers, attached
            #expect(stats.at("/undelivered")?.integerValue == 0)
            let results = try #require(c.waitAll(callers))
            #expect(results.allSatisfy { $0.outcome == .succeeded })
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            let idle = engine.stats()
            #expect(idle.at("/undelivered")?.integerValue == 0 && idle.at("/running")?.integerValue == 0)
        }
    }

    @Test func aCarrierQueuedForTheCallersRunsAtTheirPriorityNotTheLeaders() throws {
        try resetStats()
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let leader = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "very-high"}"#, on: queue, c)
            let low = try engine.request(#"{"url": "\#(server.url("/echo?n=2"))"}"#, options: #"{"priority": "low"}"#, on: queue, c)
            let normal = try engine.request(#"{"url": "\#(server.url("/echo?n=1"))"}"#, on: queue, c)
            try engine.cancel(leader)
            #expect(c.wait(leader)?.outcome == .cancelled)
            queue.setSuspended(false)
            let results = try #require(c.waitAll([low, normal]))
            #expect(results.allSatisfy { $0.outcome == .succeeded })
        }
        #expect(try arrivals() == ["/echo?n=1", "/echo?n=2"])
    }

    /// The leading caller is cancelled, or its queue closed, before its
    /// transfer ran: the callers left still get the one transfer.
    @Test(arguments: ["cancel", "close"])
    func aLeaderThatLeftBeforeItRanLeavesTheTransferToTheOthers(_ how: String) throws {
        try resetStats()
        try withEngine { engine, held, c in
            let other = try engine.makeQueue(name: "other", maxConcurrent: 1)
            held.setSuspended(true)
            let url = #"{"url": "\#(server.url("/echo?n=" + how))"}"#
            let a = try engine.request(url, on: held, c)
            let b = try engine.request(url, on: other, c)
            let d = try engine.request(url, on: held, c)  // attached: needs no slot of its suspended queue
            usleep(50_000)
            #expect(c.count == 0)  // b and d wait for a's transfer
            if how == "cancel" { try engine.cancel(a) } else { held.close() }
            #expect(c.wait(a)?.outcome == .cancelled)
            #expect(c.wait(b)?.outcome == .succeeded)
            // Closing the queue cancels d too.
            #expect(c.wait(d)?.outcome == (how == "cancel" ? .succeeded : .cancelled))
            #expect(c.duplicates.isEmpty)
        }
        #expect(try requests(to: "/echo") == 1)
    }

    @Test func aLeaderThatWaitedTooLongEndsItsCallersTheSameWay() throws {
        try resetStats()
        try withEngine { engine, held, c in
            held.setSuspended(true)
            let url = #"{"url": "\#(server.url("/echo?n=late"))"}"#
            let a = try engine.request(url, options: #"{"max_wait_ms": 100}"#, on: held, c)
            let b = try engine.request(url, options: #"{"max_wait_ms": 100}"#, on: held, c)
            let results = try #require(c.waitAll([a, b], timeoutMs: 5000))
            #expect(results.map(\.status) == [.queueTimeout, .queueTimeout])
            #expect(results.map(\.id) == [a, b])
            #expect(results[1].message?.contains("operation \(b)") == true)
        }
        #expect(try requests(to: "/echo") == 0)
    }

    @Test func aLeaderGivenADependencyLeavesTheTransferToTheOthers() throws {
        try resetStats()
        try withEngine { engine, held, c in
            let other = try engine.makeQueue(name: "other", maxConcurrent: 1)
            held.setSuspended(true)
            let first = try engine.submit(.block { _ in nil }, to: held, options: nil, completion: c.callback)
            let url = #"{"url": "\#(server.url("/echo?n=dep"))"}"#
            let a = try engine.request(url, on: held, c)
            let b = try engine.request(url, on: other, c)
            try engine.addDependency(a, on: first)
            // b no longer waits for a (which waits for `first` in a suspended queue).
            #expect(c.wait(b)?.outcome == .succeeded)
            #expect(c.wait(a, timeoutMs: 100) == nil)
            held.setSuspended(false)
            #expect(c.wait(a)?.outcome == .succeeded)
            #expect(c.completionOrder == [b, first, a])
        }
        #expect(try requests(to: "/echo") == 2)  // a's own, after b's
    }

    @Test func coalescingCanBeTurnedOff() throws {
        try resetStats()
        try withEngine(queue: 8) { engine, queue, c in
            var ids: [OpID] = []
            for _ in 0..<5 {
                ids.append(try engine.request(#"{"url": "\#(server.url("/delay?ms=100"))"}"#, options: #"{"coalesce": false}"#, on: queue, c))
            }
            #expect(c.waitAll(ids) != nil)
        }
        #expect(try requests(to: "/delay") == 5)
    }
}

extension String {
    /// A /stats by_path key is the path itself; JSON Pointer needs ~1 for "/".
    func replacingSlash() -> String {
        var out = ""
        for ch in self { out += ch == "/" ? "~1" : ch == "~" ? "~0" : String(ch) }
        return out
    }
}
