import CJansson
@testable import FetchQ
import Glibc
import Testing

/// Requests and searches through the whole engine (scheduler, transport,
/// workers, delivery) against the shared test server on 127.0.0.1.
@Suite(.serialized) struct EngineNetworkTests {
    let server: TestServer

    init() throws { server = try TestServer() }

    func stats() throws -> JSONRef {
        let (status, body) = try server.get("/stats")
        #expect(status == 200)
        return try JSONParser.parse(body, maxDepth: 64)
    }

    func resetStats() throws { _ = try server.get("/stats/reset") }

    /// Polls /stats until `key` equals `value` (bounded: 100 tries, ~5 s).
    func waitForStat(_ key: String, _ value: Int64) throws -> Bool {
        for _ in 0..<100 {
            if try stats().at("/\(key)")?.integerValue == value { return true }
            usleep(50_000)
        }
        return false
    }

    @Test func getParsesJSONAndReportsMetrics() throws {
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/json?size=3000"))"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            #expect(r.status == .ok)
            #expect(r.http?.status == 200)
            #expect(r.value?.at("/items")?.isArray == true)
            #expect(r.http?.headers?.at("/content-type")?.stringValue == "application/json")
            let body = try #require(r.http?.body)
            #expect(body.count > 2500)
            let metrics = try #require(r.http?.metrics)
            #expect(metrics.at("/bytes")?.integerValue == Int64(body.count))
            #expect(metrics.at("/attempts")?.integerValue == 1)
            #expect((metrics.at("/total_ms")?.doubleValue ?? -1) >= 0)
            #expect(metrics.at("/http_version")?.stringValue == "1.1")
        }
    }

    @Test(arguments: ["GET", "POST", "PUT", "DELETE", "PATCH", "PURGE"])
    func anyMethodWithHeadersQueryAndJSONBody(method: String) throws {
        try withEngine { engine, queue, c in
            let id = try engine.request("""
                {"method": "\(method)", "url": "\(server.url("/echo"))",
                 "headers": {"X-Trace": "abc 123"},
                 "query": {"q": "café & co", "n": 5, "ok": true},
                 "body": {"k": [1, 2]}}
                """, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            let echo = try #require(r.value)
            #expect(echo.at("/method")?.stringValue == method)
            #expect(echo.at("/headers/x-trace")?.stringValue == "abc 123")
            #expect(echo.at("/headers/content-type")?.stringValue == "application/json")
            #expect(echo.at("/headers/user-agent")?.stringValue == "fetchq/\(fetchqVersionString)")
            #expect(echo.at("/query/q")?.stringValue == "café & co")
            #expect(echo.at("/query/n")?.stringValue == "5")
            #expect(echo.at("/query/ok")?.stringValue == "true")
            #expect(echo.at("/body")?.stringValue == #"{"k":[1,2]}"#)
        }
    }

    /// Object keys are read whole, NUL bytes included (jansson's
    /// json_object_setn makes such keys): a query key "a\0b" is sent
    /// "a%00b", as a value is, and a header name "X-Tok\0Evil" is refused
    /// as no token. (Both were cut at the NUL, and "X-Tok" was sent: the
    /// tenth review.)
    @Test func keysWithANulByteAreReadWhole() throws {
        try withEngine { engine, queue, c in
            let request = json(#"{"url": "\#(server.url("/echo"))", "query": {}}"#)
            json_object_setn_new(json_object_get(request.pointer, "query"), "a\0b", 3, json_string("x"))
            let id = try engine.submitRequest(request.pointer, to: queue, options: nil, completion: c.callback)
            _ = try #require(c.wait(id))  // (the echo's key has the NUL: not a document jansson takes)
            let stats = try JSONParser.parse(try server.get("/stats").1, maxDepth: 64)
            let arrivals = (stats.at("/arrivals")?.elements ?? []).compactMap { $0.stringValue }
            #expect(arrivals.contains("/echo?a%00b=x"), "\(arrivals.suffix(3))")

            let named = json(#"{"url": "\#(server.url("/echo"))", "headers": {}}"#)
            json_object_setn_new(json_object_get(named.pointer, "headers"), "X-Tok\0Evil", 10, json_string("v"))
            #expect(throws: FetchQError.self) {
                try engine.submitRequest(named.pointer, to: queue, options: nil, completion: c.callback)
            }
            let limits = json(#"{"rate_limits": {}}"#)
            json_object_setn_new(json_object_get(limits.pointer, "rate_limits"), "h\0x", 3, json(#"{"per_second": 1}"#).newReference())
            #expect(throws: FetchQError.self) { try Engine(json: limits.pointer) }
        }
    }

    @Test func nonSuccessStatusFailsKeepingStatusAndBody() throws {
        try withEngine { engine, queue, c in
            let failing = try engine.request(#"{"url": "\#(server.url("/status/404"))"}"#, on: queue, c)
            let accepted = try engine.request(#"{"url": "\#(server.url("/status/404"))"}"#,
                                              options: #"{"accept_status": ["4xx"]}"#, on: queue, c)
            let r = try #require(c.wait(failing))
            #expect(r.outcome == .failed)
            #expect(r.status == .http)
            #expect(r.http?.status == 404)
            #expect(String(decoding: r.http?.body ?? [], as: UTF8.self) == #"{"status": 404}"#)
            #expect(r.value?.at("/status")?.integerValue == 404)
            #expect(r.message?.contains("404") == true)
            let a = try #require(c.wait(accepted))
            #expect(a.outcome == .succeeded)
            #expect(a.http?.status == 404)
        }
    }

    @Test func submitRejectsBadSchemesCRLFAndUnknownOptions() throws {
        try withEngine { engine, queue, c in
            let cases: [(String, String?, String)] = [
                (#"{"url": "ftp://127.0.0.1/x"}"#, nil, "http"),
                (#"{"url": "file:///etc/passwd"}"#, nil, "http"),
                (#"{"url": "\#(server.url("/echo"))", "headers": {"X-A": "a\r\nX-Injected: 1"}}"#, nil, "CR"),
                (#"{"url": "\#(server.url("/echo"))", "headers": {"Bad Name": "a"}}"#, nil, "token"),
                (#"{"url": "\#(server.url("/echo"))", "method": "GE T"}"#, nil, "method"),
                (#"{"url": "\#(server.url("/echo"))", "bogus": 1}"#, nil, "bogus"),
                (#"{"url": "\#(server.url("/echo"))"}"#, #"{"timeout_ms": "soon"}"#, "timeout_ms"),
                (#"{"url": "\#(server.url("/echo"))"}"#, #"{"retries": 3}"#, "retries"),
            ]
            for (request, options, word) in cases {
                #expect(throws: FetchQError.self) { _ = try engine.request(request, options: options, on: queue, c) }
                do {
                    _ = try engine.request(request, options: options, on: queue, c)
                } catch let error as FetchQError {
                    #expect(error.status == .invalid)
                    #expect(error.message.contains(word), "message \(error.message) should mention \(word)")
                } catch {
                    Issue.record("unexpected error \(error)")
                }
            }
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(c.count == 0)  // a failed submit never calls back
        }
    }

    @Test func searchExtractsSortsAndCounts() throws {
        let config = """
            {"search": {"url": "\(server.url("/search?q={query}&rpp=500"))", "results": "/results",
                        "id": "/id", "sort": "/created_at", "order": "desc"}}
            """
        try withEngine(config) { engine, queue, c in
            // Without options, or with common ones only, the engine's search
            // settings read once at its creation serve the submit.
            #expect(engine.defaultSearch?.endpoint.url == server.url("/search?q={query}&rpp=500"))
            let id = try engine.search("swift", on: queue, c)
            let asc = try engine.search("swift", options: #"{"order": "asc"}"#, on: queue, c)
            let high = try engine.search("swift", options: #"{"priority": "high", "group": "g"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(c.wait(high)?.value?.dumps() == r.value?.dumps())
            #expect(r.outcome == .succeeded)
            let value = try #require(r.value)
            #expect(value.at("/query")?.stringValue == "swift")
            let (_, corpusBody) = try server.get("/corpus?tag=swift")
            let corpus = try JSONParser.parse(corpusBody, maxDepth: 64)
            let expected = try #require(corpus.isArray ? corpus : corpus.at("/items") ?? corpus.at("/results"))
            #expect(value.at("/count")?.integerValue == Int64(expected.count))
            let dates = (value.at("/items")?.elements ?? []).compactMap { $0.at("/created_at")?.stringValue }
            #expect(dates.count == expected.count)
            #expect(dates == dates.sorted(by: >))
            let ascDates = (c.wait(asc)?.value?.at("/items")?.elements ?? []).compactMap { $0.at("/created_at")?.stringValue }
            #expect(ascDates == dates.reversed())
        }
    }

    @Test func searchFailuresAreReported() throws {
        let config = #"{"search": {"url": "\#(server.url("/search?q={query}"))", "results": "/results"}}"#
        try withEngine(config) { engine, queue, c in
            let fail = try engine.search("__fail", on: queue, c)
            let bad = try engine.search("__bad", on: queue, c)
            let notArray = try engine.search("__notarray", on: queue, c)
            let missing = try engine.search("swift", options: #"{"results": "/nope"}"#, on: queue, c)
            #expect(c.wait(fail)?.status == .http)
            #expect(c.wait(fail)?.http?.status == 500)
            #expect(c.wait(bad)?.status == .parse)
            #expect(c.wait(notArray)?.status == .parse)
            #expect(c.wait(missing)?.status == .parse)
            #expect(c.wait(missing)?.message?.contains("/nope") == true)
        }
        // No endpoint configured and none given: an error at submit.
        try withEngine { engine, queue, c in
            #expect(throws: FetchQError.self) { _ = try engine.search("x", on: queue, c) }
        }
    }

    @Test func searchURLEncodesTheQuery() throws {
        let config = #"{"search": {"url": "\#(server.url("/echo?q={query}"))", "results": "/query"}}"#
        try withEngine(config) { engine, queue, c in
            let id = try engine.search("a b&c=d/é?", options: #"{"results": "", "id": "/x"}"#, on: queue, c)
            let r = try #require(c.wait(id))
            // The echo document is an object, not an array: a parse error that
            // still proves the request went out; check the server saw the query.
            #expect(r.status == .parse)
            let arrivals = try stats().at("/arrivals")?.elements.compactMap(\.stringValue) ?? []
            #expect(arrivals.last == "/echo?q=a%20b%26c%3Dd%2F%C3%A9%3F")
        }
    }

    @Test func perHostLimitIsSeenByTheServer() throws {
        try resetStats()
        try withEngine(#"{"max_per_host": 3}"#, queue: 16) { engine, queue, c in
            var ids: [OpID] = []
            // Identical GETs would share one transfer: this test is about limits.
            for _ in 0..<12 {
                ids.append(try engine.request(#"{"url": "\#(server.url("/delay?ms=150"))"}"#, options: #"{"coalesce": false}"#, on: queue, c))
            }
            let results = try #require(c.waitAll(ids))
            #expect(results.allSatisfy { $0.outcome == .succeeded })
        }
        #expect(try stats().at("/max_in_flight")?.integerValue == 3)
    }

    @Test func queueConcurrencyIsSeenByTheServer() throws {
        try resetStats()
        try withEngine(#"{"max_per_host": 64}"#, queue: 5) { engine, queue, c in
            var ids: [OpID] = []
            for _ in 0..<20 {
                ids.append(try engine.request(#"{"url": "\#(server.url("/delay?ms=100"))"}"#, options: #"{"coalesce": false}"#, on: queue, c))
            }
            #expect(c.waitAll(ids) != nil)
        }
        #expect(try stats().at("/max_in_flight")?.integerValue == 5)
    }

    @Test func priorityOrderIsTheServersArrivalOrder() throws {
        try resetStats()
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let plan: [(String, Int)] = [("low", 1), ("very-high", 2), ("normal", 3), ("very-high", 4), ("very-low", 5), ("high", 6)]
            var ids: [OpID] = []
            for (priority, n) in plan {
                ids.append(try engine.request(#"{"url": "\#(server.url("/echo?n=\(n)"))"}"#,
                                              options: #"{"priority": "\#(priority)"}"#, on: queue, c))
            }
            queue.setSuspended(false)
            #expect(c.waitAll(ids) != nil)
        }
        let arrivals = try stats().at("/arrivals")?.elements.compactMap(\.stringValue) ?? []
        #expect(arrivals == ["/echo?n=2", "/echo?n=4", "/echo?n=6", "/echo?n=3", "/echo?n=1", "/echo?n=5"])
    }

    /// A parsed value goes back to the transfer thread that built it even
    /// while that thread sleeps in curl_multi_poll, and is freed there when
    /// it wakes (at least once a second): closing its release list for every
    /// sleep left values to be freed on other threads, against its malloc
    /// arena (bench/findings.md, Sixteenth round).
    @Test func aValueDroppedWhileItsTransferThreadSleepsIsFreedThere() throws {
        final class Slot: @unchecked Sendable {
            let lock = ConditionLock()
            var result: OperationResult?
        }
        // No history of values: the callback's result is the value's only holder.
        try withEngine(#"{"history_values": 0}"#) { engine, queue, _ in
            let slot = Slot()
            let request = json(#"{"url": "\#(server.url("/json?size=200"))"}"#)
            _ = try withExtendedLifetime(request) {
                try engine.submitRequest(request.pointer, to: queue, options: nil) { result in
                    slot.lock.withLock { slot.result = result }
                }
            }
            #expect(engine.waitIdle(timeoutMs: 20_000) == .ok)
            var result = slot.lock.withLock { slot.result.take() }
            let raw = try #require(result?.value?.pointer)
            json_incref(raw)  // ours, to watch the count
            #expect(raw.pointee.refcount == 2)
            usleep(100_000)  // the idle transfer thread is asleep in its poll by now
            result = nil  // dropped on this thread: handed back, not freed here
            #expect(raw.pointee.refcount == 2)
            var freed = false
            for _ in 0..<300 where !freed {  // the loop wakes within a second
                usleep(10_000)
                freed = raw.pointee.refcount == 1
            }
            #expect(freed)
            json_decref(raw)
        }
    }

    @Test func cancelInFlightAbortsTheTransferAndClosesTheConnection() throws {
        try resetStats()
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/stall"))"}"#, on: queue, c)
            #expect(try waitForStat("in_flight", 1))
            try engine.cancel(id)
            let r = try #require(c.wait(id, timeoutMs: 5000))
            #expect(r.outcome == .cancelled)
            #expect(r.status == .cancelled)
            #expect(try waitForStat("open_connections", 0))
            try engine.cancel(id)  // cancelled already: harmless (FQ_OK)
        }
    }

    @Test func timeoutsRedirectsAndSizeCaps() throws {
        try withEngine { engine, queue, c in
            let stall = try engine.request(#"{"url": "\#(server.url("/stall"))"}"#, options: #"{"timeout_ms": 300}"#, on: queue, c)
            let redirects = try engine.request(#"{"url": "\#(server.url("/redirect?n=3"))"}"#, on: queue, c)
            let loop = try engine.request(#"{"url": "\#(server.url("/redirect-loop"))"}"#, on: queue, c)
            let capped = try engine.request(#"{"url": "\#(server.url("/redirect?n=3"))"}"#, options: #"{"max_redirects": 2}"#, on: queue, c)
            let exact = try engine.request(#"{"url": "\#(server.url("/bytes?n=1000"))"}"#, options: #"{"max_response_bytes": 1000}"#, on: queue, c)
            let over = try engine.request(#"{"url": "\#(server.url("/bytes?n=1001"))"}"#, options: #"{"max_response_bytes": 1000}"#, on: queue, c)
            let refused = try engine.request(#"{"url": "http://127.0.0.1:1/"}"#, on: queue, c)
            #expect(c.wait(stall)?.status == .timeout)
            #expect(c.wait(redirects)?.outcome == .succeeded)
            #expect(c.wait(redirects)?.http?.metrics?.at("/redirects")?.integerValue == 3)
            #expect(c.wait(loop)?.status == .redirect)
            #expect(c.wait(capped)?.status == .redirect)
            #expect(c.wait(exact)?.http?.body.count == 1000)
            #expect(c.wait(over)?.status == .tooLarge)
            #expect(c.wait(refused)?.status == .network)
        }
    }

    @Test func maxWaitFailsOperationsStuckInTheQueue() throws {
        try withEngine(queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let id = try engine.request(#"{"url": "\#(server.url("/json"))"}"#, options: #"{"max_wait_ms": 50}"#, on: queue, c)
            let r = try #require(c.wait(id, timeoutMs: 5000))
            #expect(r.outcome == .failed)
            #expect(r.status == .queueTimeout)
        }
    }

    @Test func progressEventsPrecedeTheCompletion() throws {
        try withEngine { engine, queue, c in
            let id = try engine.request(#"{"url": "\#(server.url("/drip?bytes=4000&chunk=500&interval_ms=30"))"}"#,
                                        options: #"{"progress_interval_ms": 0}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            let events = c.allEvents.filter { $0.id == id }
            #expect(events.count >= 2)
            let received = events.map(\.received)
            #expect(received == received.sorted())
            #expect(received.last == 4000)
            #expect(events.allSatisfy { $0.expected == 4000 || $0.expected == 0 })
            let log = c.deliveryLog
            #expect(log.lastIndex(of: "event \(id)")! < log.firstIndex(of: "done \(id)")!)
        }
    }

    /// jansson cannot nest deeper than 2048, so a larger max_json_depth is
    /// refused rather than accepted and not honoured; a document over the
    /// limit is "nested too deeply", not "not valid JSON".
    @Test func maxJSONDepthStopsAtJanssonsLimitAndSaysWhy() throws {
        for text in [#"{"max_json_depth": 2049}"#, #"{"max_json_depth": 100000}"#] {
            let config = json(text)
            #expect(throws: FetchQError.self, "\(text)") {
                _ = try withExtendedLifetime(config) { try EngineConfig(json: config.pointer) }
            }
        }
        try withEngine(#"{"max_json_depth": 2048}"#) { engine, queue, c in
            #expect(throws: FetchQError.self) {
                _ = try engine.request(#"{"url": "\#(server.url("/deep?n=10"))"}"#,
                                       options: #"{"max_json_depth": 2049}"#, on: queue, c)
            }
            let deepest = try engine.request(#"{"url": "\#(server.url("/deep?n=2048"))"}"#,
                                             options: #"{"parse": "json"}"#, on: queue, c)
            let over = try engine.request(#"{"url": "\#(server.url("/deep?n=30"))"}"#,
                                          options: #"{"parse": "json", "max_json_depth": 20}"#, on: queue, c)
            let r = try #require(c.wait(deepest))
            #expect(r.outcome == .succeeded, "\(r.message ?? "")")
            var depth = 0
            var value = r.value
            while let v = value, v.isArray {
                depth += 1
                value = v.elements.first
            }
            #expect(depth == 2048)
            let o = try #require(c.wait(over))
            #expect(o.status == .parse)
            #expect(o.message?.contains("nested too deeply") == true, "\(o.message ?? "")")
            #expect(o.message?.contains("not valid JSON") == false)
        }
    }

    /// A parse failure names the method and URL, and says whether the body
    /// is not JSON or JSON that jansson cannot hold (RFC 8259 sets no limit
    /// on numbers, jansson does).
    @Test func parseFailuresSayWhatWasWrong() throws {
        let fileServer = try TestServer(files: try JSONSuiteFiles.directory())
        try withEngine { engine, queue, c in
            let big = fileServer.url("/file/i_number_too_big_pos_int.json")
            let bad = fileServer.url("/file/n_array_just_minus.json")
            let a = try engine.request(#"{"url": "\#(big)", "method": "PUT"}"#, options: #"{"parse": "json"}"#, on: queue, c)
            let b = try engine.request(#"{"url": "\#(bad)"}"#, options: #"{"parse": "json"}"#, on: queue, c)
            let ra = try #require(c.wait(a))
            #expect(ra.status == .parse)
            #expect(ra.message?.hasPrefix("PUT \(big): the response is JSON that jansson cannot hold: ") == true,
                    "\(ra.message ?? "")")
            let rb = try #require(c.wait(b))
            #expect(rb.status == .parse)
            #expect(rb.message?.hasPrefix("GET \(bad): the response is not valid JSON: ") == true, "\(rb.message ?? "")")
        }
    }

    /// A failed transfer's metrics have every documented key, with what
    /// curl measured before the failure (they were zeros, without
    /// "from_cache").
    @Test func metricsOfAFailedTransferSayWhatHappened() throws {
        try withEngine { engine, queue, c in
            let slow = try engine.request(#"{"url": "\#(server.url("/delay?ms=3000"))"}"#,
                                          options: #"{"timeout_ms": 300}"#, on: queue, c)
            let loop = try engine.request(#"{"url": "\#(server.url("/redirect-loop"))"}"#,
                                          options: #"{"max_redirects": 3}"#, on: queue, c)
            let r = try #require(c.wait(slow))
            #expect(r.status == .timeout)
            let m = try #require(r.http?.metrics)
            for key in ["queue_wait_ms", "connect_ms", "first_byte_ms", "total_ms", "bytes", "redirects", "attempts",
                        "http_version", "reused_connection", "from_cache"] {
                #expect(m[key] != nil, "\(key)")
            }
            #expect((m["total_ms"]?.doubleValue ?? 0) >= 250, "\(m.dumps())")
            #expect(m["from_cache"]?.boolValue == false)
            // A connection refused: none was made, so none was reused
            // (the metric said true when curl counted no new connection).
            let refused = try #require(c.wait(try engine.request(#"{"url": "http://127.0.0.1:1/"}"#, on: queue, c)))
            #expect(refused.status == .network)
            #expect(refused.http?.metrics?["reused_connection"]?.boolValue == false)
            let l = try #require(c.wait(loop))
            #expect(l.status == .redirect)
            #expect(l.http?.metrics?["redirects"]?.integerValue == 3, "\(l.http?.metrics?.dumps() ?? "")")
            #expect((l.http?.metrics?["total_ms"]?.doubleValue ?? 0) > 0)
        }
    }

    @Test func jsonTestSuiteOverHTTP() throws {
        let dir = try JSONSuiteFiles.directory()
        let files = try JSONSuiteFiles.names()
        #expect(files.count == 318)
        let fileServer = try TestServer(files: dir)
        try withEngine(#"{"max_per_host": 8}"#, queue: 8) { engine, queue, c in
            var ids: [(String, OpID)] = []
            for name in files {
                let encoded = URLUtilities.percentEncode(name)
                ids.append((name, try engine.request(#"{"url": "\#(fileServer.url("/file/" + encoded))"}"#,
                                                     options: #"{"parse": "json", "max_json_depth": 2048}"#, on: queue, c)))
            }
            for (name, id) in ids {
                guard let r = c.wait(id) else {
                    Issue.record("\(name): no callback")
                    continue
                }
                let janssonLimit = JSONTestSuiteTests.janssonRejectsValid.contains(name)
                if name.hasPrefix("y_") && !janssonLimit {
                    #expect(r.outcome == .succeeded, "\(name): \(r.message ?? "")")
                } else if name.hasPrefix("n_") {
                    #expect(r.outcome == .failed && r.status == .parse, "\(name) should fail to parse")
                } else if janssonLimit {
                    // jansson cannot hold a NUL in an object key (see JSONTestSuiteTests).
                    #expect(r.status == .parse)
                } else {
                    #expect(r.outcome != .cancelled, "\(name)")
                }
            }
            #expect(c.duplicates.isEmpty)
            #expect(c.count == files.count)
        }
    }

    // MARK: - Many requests at once (fq_submit_requests)

    @Test func submitRequestsMakesOneOperationPerURLInOrder() throws {
        try withEngine { engine, queue, c in
            let urls = (0..<70).map { server.url("/echo?i=\($0)") }
            let request = json(#"{"method": "PUT", "headers": {"X-Batch": "1"}}"#)
            let (ids, stopped) = try withExtendedLifetime(request) {
                try engine.submitRequests(request.pointer, urls: urls, to: queue, options: nil) { _ in .swift(c.callback) }
            }
            #expect(stopped == nil)
            #expect(ids.count == 70)
            #expect(ids == ids.sorted() && Set(ids).count == 70)
            let results = try #require(c.waitAll(ids))
            for (i, r) in results.enumerated() {
                #expect(r.outcome == .succeeded)
                #expect(r.value?.at("/method")?.stringValue == "PUT")
                #expect(r.value?.at("/query/i")?.stringValue == "\(i)")
                #expect(r.value?.at("/headers/x-batch")?.stringValue == "1")
            }
            #expect(c.duplicates.isEmpty)
        }
    }

    @Test func submitRequestsStopsWhereTheQueueClosedAndKeepsWhatWasSubmitted() throws {
        try withEngine { engine, queue, c in
            try resetStats()
            queue.setSuspended(true)
            let urls = (0..<100).map { server.url("/echo?i=\($0)") }
            // The callbacks are made outside the engine lock, one batch of
            // 64 at a time: closing the queue while the second batch is made
            // stops the call after the first.
            let (ids, stopped) = try engine.submitRequests(nil, urls: urls, to: queue, options: nil) { i in
                if i == Engine.batchPerLock { queue.close() }
                return .swift(c.callback)
            }
            #expect(ids.count == Engine.batchPerLock)
            #expect(stopped != nil)
            // The first 64 are ordinary operations of the closed queue: never
            // started, cancelled, each called back once.
            let results = try #require(c.waitAll(ids))
            #expect(results.allSatisfy { $0.outcome == .cancelled })
            #expect(c.count == Engine.batchPerLock)
            #expect(c.duplicates.isEmpty)
            #expect(try stats().at("/requests")?.integerValue == 0)
        }
    }

    @Test func submitRequestsRejectsEverythingWhenOneURLIsBad() throws {
        try withEngine { engine, queue, c in
            try resetStats()
            var urls = (0..<10).map { server.url("/echo?i=\($0)") }
            urls[7] = "http://127.0.0.1:1/a b"
            let error = #expect(throws: FetchQError.self) {
                _ = try engine.submitRequests(nil, urls: urls, to: queue, options: nil) { _ in .swift(c.callback) }
            }
            #expect(error?.status == .invalid)
            #expect(error?.message.hasPrefix("urls[7]: ") == true)
            // Once the queue is closed, nothing is submitted: a throw, not an empty result.
            urls[7] = server.url("/echo")
            queue.close()
            #expect(throws: FetchQError.self) {
                _ = try engine.submitRequests(nil, urls: urls, to: queue, options: nil) { _ in .swift(c.callback) }
            }
            usleep(100_000)
            #expect(c.count == 0)
            #expect(try stats().at("/requests")?.integerValue == 0)
        }
    }

}
