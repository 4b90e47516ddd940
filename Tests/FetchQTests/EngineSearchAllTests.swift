import CJansson
@testable import FetchQ
import Glibc
import Testing

/// Fan-out searches through the engine against the test server's corpus.
@Suite(.serialized) struct EngineSearchAllTests {
    let server: TestServer
    init() throws { server = try TestServer() }

    var config: String { server.searchConfig }

    func corpus(tag: String) throws -> [JSONRef] {
        let (status, body) = try server.get("/corpus?tag=\(tag)")
        #expect(status == 200)
        let doc = try JSONParser.parse(body, maxDepth: 64)
        return (doc.isArray ? doc : doc.at("/items") ?? doc.at("/results"))?.elements ?? []
    }

    func submitAll(_ engine: Engine, _ queries: [String], options: String? = nil, on queue: Queue,
                   _ c: Completions) throws -> OpID {
        let o = options.map { json($0) }
        return try withExtendedLifetime(o) {
            try engine.submitSearchAll(queries, to: queue, options: o?.pointer, completion: c.callback)
        }
    }

    @Test func mergedDeduplicatedAndSortedAgainstTheCorpus() throws {
        let tags = ["swift", "c", "python", "json"]
        // Expected: union of the corpus items of each tag, by id, newest first.
        var expected: [String: String] = [:]  // id -> created_at
        for tag in tags {
            for item in try corpus(tag: tag) {
                expected[item.at("/id")!.stringValue!] = item.at("/created_at")!.stringValue!
            }
        }
        let overlap = try tags.map { try corpus(tag: $0).count }.reduce(0, +) - expected.count
        #expect(overlap > 0, "the corpus should make de-duplication matter")
        try withEngine(config, queue: 2) { engine, queue, c in
            let id = try submitAll(engine, tags + ["swift"], on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            let value = try #require(r.value)
            let items = value.at("/items")?.elements ?? []
            let ids = items.compactMap { $0.at("/id")?.stringValue }
            #expect(Set(ids) == Set(expected.keys))
            #expect(ids.count == expected.count)
            let dates = items.compactMap { $0.at("/created_at")?.stringValue }
            #expect(dates == dates.sorted(by: >))
            #expect(value.at("/count")?.integerValue == Int64(expected.count))
            for tag in tags {
                #expect(value.at("/queries/\(tag)/count")?.integerValue == Int64(try corpus(tag: tag).count))
            }
            // Only the parent called back; children counted in stats (4 + 1).
            #expect(c.count == 1)
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(engine.stats().at("/succeeded")?.integerValue == 5)
        }
    }

    /// Distinct queries are distinct bytes: "\u{E9}" and "e\u{301}" are two
    /// requests (a Set<String> made them one: Swift compares strings by
    /// canonical equivalence, a server by bytes).
    @Test func queriesThatDifferOnlyInUnicodeFormAreTwoQueries() throws {
        try withEngine(config, queue: 2) { engine, queue, c in
            let queries = ["\u{E9}", "e\u{301}", "\u{212A}", "K", "\u{E9}"]
            let id = try submitAll(engine, queries, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            let byQuery = try #require(r.value?.at("/queries"))
            #expect(json_object_size(byQuery.pointer) == 4)
            for q in queries {
                let child = q.withCString { json_object_get(byQuery.pointer, $0) }
                #expect(child != nil, "no result for \(Array(q.utf8))")
            }
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(engine.stats().at("/succeeded")?.integerValue == 5)  // 4 children and the parent
        }
    }

    @Test func partialFailureAndFailFast() throws {
        try withEngine(config, queue: 2) { engine, queue, c in
            let partial = try submitAll(engine, ["swift", "__fail", "rust"], on: queue, c)
            let r = try #require(c.wait(partial))
            #expect(r.outcome == .succeeded)
            #expect(r.value?.at("/queries/__fail/http_status")?.integerValue == 500)
            #expect(r.value?.at("/queries/__fail/status")?.integerValue == Int64(FQStatus.http.rawValue))
            #expect(r.value?.at("/queries/rust/count")?.integerValue == Int64(try corpus(tag: "rust").count))

            let fast = try submitAll(engine, ["__fail", "__slow", "go"], options: #"{"fail_fast": true}"#, on: queue, c)
            let f = try #require(c.wait(fast))
            #expect(f.outcome == .failed)
            #expect(f.status == .http)
            #expect(f.message?.contains("__fail") == true)
        }
    }

    /// A child that ends before it starts passes the parent no result: the
    /// report used to call it "cancelled" (-7) and fail_fast FQ_ERR_OPERATION
    /// with an empty reason, whatever ended it.
    @Test func childrenThatWaitedTooLongAreReportedAsSuch() throws {
        try withEngine(config, queue: 1) { engine, queue, c in
            for failFast in [false, true] {
                queue.setSuspended(true)
                let id = try submitAll(engine, ["swift", "c"],
                                       options: #"{"max_wait_ms": 20, "fail_fast": \#(failFast)}"#, on: queue, c)
                usleep(200_000)  // both children's 20 ms run out while the queue is suspended
                queue.setSuspended(false)
                let r = try #require(c.wait(id))
                let waited = "waited in its queue longer than its max_wait_ms"
                if failFast {
                    #expect(r.outcome == .failed)
                    #expect(r.status == .queueTimeout)
                    #expect(r.message?.contains("query \"swift\" failed: operation") == true, "\(r.message ?? "")")
                    #expect(r.message?.contains(waited) == true, "\(r.message ?? "")")
                } else {
                    #expect(r.outcome == .succeeded)
                    #expect(r.value?.at("/count")?.integerValue == 0)
                    for query in ["swift", "c"] {
                        #expect(r.value?.at("/queries/\(query)/status")?.integerValue == Int64(FQStatus.queueTimeout.rawValue))
                        #expect(r.value?.at("/queries/\(query)/error")?.stringValue?.contains(waited) == true)
                    }
                }
            }
            #expect(c.duplicates.isEmpty)
        }
    }

    /// How the parent is cancelled: by its id, or in bulk (its group, its
    /// queue, everything), which ends it and its queued children in one pass.
    enum ParentCancel: CaseIterable { case byID, group, queue, all }

    @Test(arguments: ParentCancel.allCases)
    func cancellingTheParentCancelsEveryChildWithOneCallback(_ how: ParentCancel) throws {
        try withEngine(config, queue: 1) { engine, queue, c in
            queue.setSuspended(true)
            let id = try submitAll(engine, ["__slow", "swift", "c", "go"],
                                   options: #"{"child_events": true, "group": "g"}"#, on: queue, c)
            queue.setSuspended(false)
            usleep(50_000)  // let the first child start (not an assertion: both paths are checked)
            switch how {
            case .byID: try engine.cancel(id)
            case .group: #expect(engine.cancelGroup("g") >= 1)
            case .queue: #expect(queue.cancelAll() >= 1)
            case .all: #expect(engine.cancelAll() >= 1)
            }
            let r = try #require(c.wait(id))
            #expect(r.outcome == .cancelled)
            #expect(engine.waitIdle(timeoutMs: 10_000) == .ok)
            let stats = engine.stats()
            #expect(stats.at("/cancelled")?.integerValue == 5)
            #expect(stats.at("/succeeded")?.integerValue == 0)
            #expect(c.count == 1)
            // Every child's event (cancelled), once each, before the parent's callback.
            let events = c.allEvents.filter { $0.kind == .child && $0.id == id }
            #expect(events.count == 4)
            #expect(Set(events.compactMap(\.query)) == ["__slow", "swift", "c", "go"])
            #expect(events.allSatisfy { $0.child?.outcome == .cancelled })
            let log = c.deliveryLog
            let done = try #require(log.firstIndex(of: "done \(id)"))
            #expect(log.lastIndex(of: "event \(id)").map { $0 < done } == true)
        }
    }

    /// Found by the fuzzer: a dependency that had already failed crashed
    /// the submit. Now the parent ends CANCELLED naming it, once.
    @Test func aDependencyThatAlreadyFailedCancelsTheWholeSearch() throws {
        try withEngine(config, queue: 2) { engine, queue, c in
            let failing = try engine.submit(.block { op in
                try? op.setError("no")
                return nil
            }, to: queue, options: nil, completion: c.callback)
            #expect(c.wait(failing)?.outcome == .failed)
            let id = try submitAll(engine, ["swift", "c"], options: #"{"depends_on": [\#(failing)]}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .cancelled)
            #expect(r.status == .dependency)
            #expect(r.message?.contains("\(failing)") == true)
            #expect(engine.waitIdle(timeoutMs: 5000) == .ok)
            #expect(c.duplicates.isEmpty)
            #expect(engine.stats().at("/cancelled")?.integerValue == 3)
        }
    }

    @Test func childEventsArriveBeforeTheParentsCallback() throws {
        try withEngine(config, queue: 2) { engine, queue, c in
            let id = try submitAll(engine, ["swift", "c", "__fail"], options: #"{"child_events": true}"#, on: queue, c)
            let r = try #require(c.wait(id))
            #expect(r.outcome == .succeeded)
            let events = c.allEvents.filter { $0.kind == .child && $0.id == id }
            #expect(Set(events.compactMap(\.query)) == ["swift", "c", "__fail"])
            #expect(events.first(where: { $0.query == "__fail" })?.child?.status == .http)
            #expect(events.first(where: { $0.query == "swift" })?.child?.value?.at("/query")?.stringValue == "swift")
            let log = c.deliveryLog
            let done = try #require(log.firstIndex(of: "done \(id)"))
            #expect(log.lastIndex(of: "event \(id)").map { $0 < done } == true)
        }
    }
}
