import CJansson
@testable import FetchQ
import Glibc
import Testing

/// What the history keeps of a network result for a dependent submitted
/// after the operation ended (`history_values`): its history form. The
/// callback's document is freed once the callback and the program let the
/// result go, not `history_values` results later; a later dependent gets the
/// same outcome, response parts and an equal value, parsed again from the
/// body (bench/findings.md, "Twentieth round").
@Suite(.serialized) struct HistoryFormTests {
    let server: TestServer
    init() throws { server = try TestServer() }

    var config: String { server.searchConfig }

    /// What a callback saw, kept without keeping its result.
    final class Seen: @unchecked Sendable {
        let lock = ConditionLock()
        var value: UnsafeMutablePointer<json_t>? = nil  // one reference of ours
        var text = ""
        var body: [UInt8] = []
        /// The result came with a history form.
        var hadForm = false
        var done = false
    }

    /// What a dependent submitted after the operation ended read from it.
    struct Read {
        var status = FQStatus.ok
        var httpStatus = 0
        var value: UnsafeMutablePointer<json_t>? = nil
        var text: String? = nil
        var body: [UInt8] = []
        var message: String? = nil
    }

    /// Runs one operation (`submit` with a callback that reads the value and
    /// keeps only a reference to it), waits for it, then submits a block that
    /// depends on it and reads its result. Returns whether the callback's
    /// document was freed while the history still kept the operation (our
    /// own reference the only one left), and what the dependent read.
    func run(_ engine: Engine, _ queue: Queue,
             _ submit: (@escaping Completion) throws -> OpID) throws -> (freed: Bool, seen: Seen, read: Read) {
        let seen = Seen()
        let id = try submit { result in
            seen.lock.withLock {
                if let value = result.value {
                    seen.value = json_incref(value.pointer)
                    seen.text = value.text
                }
                seen.body = result.bodyBytes.map(Array.init) ?? []
                seen.hadForm = result.historyForm != nil
                seen.done = true
            }
            seen.lock.broadcast()
        }
        #expect(engine.waitIdle(timeoutMs: 20_000) == .ok)
        let raw = try #require(seen.lock.withLock { seen.done ? seen.value : nil })
        // The delivery thread lets the result go after the callback; the
        // transfer thread frees a value handed back to it within a second.
        var freed = false
        for _ in 0..<300 where !freed {
            freed = raw.pointee.refcount == 1
            if !freed { usleep(10_000) }
        }
        final class Box: @unchecked Sendable { var read = Read() }
        let box = Box()
        let options = json(#"{"depends_on": [\#(id)]}"#)
        let c = Completions()
        let later = try withExtendedLifetime(options) {
            try engine.submit(.block { op in
                let r = op.dependency(id)
                box.read.status = r?.status ?? .notFound
                box.read.httpStatus = r?.http?.status ?? 0
                box.read.value = r?.value?.pointer
                box.read.text = r?.value?.text
                box.read.body = r?.bodyBytes.map(Array.init) ?? []
                box.read.message = r?.message
                return nil
            }, to: queue, options: options.pointer, completion: c.callback)
        }
        #expect(c.wait(later)?.outcome == .succeeded)
        return (freed, seen, box.read)
    }

    func expectEqual(_ seen: Seen, _ read: Read) {
        #expect(seen.hadForm)
        #expect(read.status == .ok)
        #expect(read.httpStatus == 200)
        #expect(read.text == seen.text && !seen.text.isEmpty)
        #expect(read.body == seen.body && !seen.body.isEmpty)
        // Parsed again: another document than the callback's.
        #expect(read.value != nil && read.value != seen.value)
    }

    @Test(arguments: [#"{"parse": "json", "coalesce": false}"#, #"{"parse": "json"}"#,
                      #"{"parse": "json", "lazy_parse": true}"#])
    func aRequestsDocumentIsFreedAndALaterDependentGetsItsValue(options: String) throws {
        try withEngine(config) { engine, queue, _ in
            let request = json(#"{"url": "\#(server.url("/json?size=300"))"}"#)
            let opts = json(options)
            let (freed, seen, read) = try withExtendedLifetime((request, opts)) {
                try run(engine, queue) { done in
                    try engine.submitRequest(request.pointer, to: queue, options: opts.pointer, completion: done)
                }
            }
            #expect(freed, "the history kept the callback's document")
            expectEqual(seen, read)
            json_decref(seen.value)
        }
    }

    @Test func aSearchsDocumentIsFreedAndALaterDependentGetsItsValue() throws {
        try withEngine(config) { engine, queue, _ in
            let (freed, seen, read) = try run(engine, queue) { done in
                try engine.submitSearch("swift", to: queue, options: nil, completion: done)
            }
            #expect(freed, "the history kept the callback's document")
            expectEqual(seen, read)
            // The search's own value: sorted items, their count, the query.
            let value = json(seen.text)
            #expect(value.at("/query")?.stringValue == "swift")
            let dates = value.at("/items")?.elements.compactMap { $0.at("/created_at")?.stringValue } ?? []
            #expect(!dates.isEmpty && dates == dates.sorted(by: >))
            #expect(value.at("/count")?.integerValue == Int64(dates.count))
            json_decref(seen.value)
        }
    }

    /// A search with "store": its value says what storing did, which the
    /// body cannot tell again, so the history keeps the result itself.
    @Test func aStoringSearchKeepsItsResult() throws {
        let directory = try StoreTestDirectory()
        defer { directory.remove() }
        try withEngine(config) { engine, queue, _ in
            let path = directory.file("h.db")
            let opts = json(#"{"store": {"path": "\#(path)", "collection": "posts"}}"#)
            let (freed, seen, read) = try withExtendedLifetime(opts) {
                try run(engine, queue) { done in
                    try engine.submitSearch("swift", to: queue, options: opts.pointer, completion: done)
                }
            }
            #expect(!freed && !seen.hadForm)
            #expect(read.value == seen.value)
            #expect(read.text == seen.text && json(seen.text).at("/store/inserted") != nil)
            json_decref(seen.value)
        }
    }

    /// With "history_values": 0 nothing is kept for later dependents, so no
    /// form is made either.
    @Test func noHistoryValuesKeepNoForm() throws {
        try withEngine(#"{"history_values": 0}"#) { engine, queue, _ in
            let request = json(#"{"url": "\#(server.url("/json?size=300"))"}"#)
            let (freed, seen, read) = try withExtendedLifetime(request) {
                try run(engine, queue) { done in
                    try engine.submitRequest(request.pointer, to: queue, options: nil, completion: done)
                }
            }
            #expect(freed && !seen.hadForm)
            #expect(read.status == .ok && read.value == nil && read.body.isEmpty)
            // What was dropped, said without an off-by-one ("more than 0" when none finished after it).
            #expect(read.httpStatus == 0)
            #expect(read.message?.hasSuffix("is no longer kept: at least history_values (0) network operations finished after it") == true,
                    "\(read.message ?? "nil")")
            json_decref(seen.value)
        }
    }

    /// A search-all's parent is a search: "history_values" bounds what the
    /// history keeps of its merged value, as for any network result (a soak
    /// review found each parent's value kept for all of "history": 45 KB
    /// each, 274 MB with "history": 20000).
    @Test func aSearchAllsMergedValueIsBoundByHistoryValues() throws {
        let config = String(server.searchConfig.dropLast()) + #", "history_values": 0}"#
        try withEngine(config) { engine, queue, _ in
            let (freed, seen, read) = try run(engine, queue) { done in
                try engine.submitSearchAll(["swift", "c"], to: queue, options: nil, completion: done)
            }
            #expect(freed)
            #expect(seen.text.contains("\"items\""))
            #expect(read.status == .ok && read.value == nil)
            #expect(read.message?.hasSuffix("is no longer kept: at least history_values (0) network operations finished after it") == true,
                    "\(read.message ?? "nil")")
            json_decref(seen.value)
        }
    }

    /// A large body's copy made for `fq_result_body` stays with the result
    /// that made it: the history form shares the body's array, not that
    /// copy, also for a response without a value (a soak review: a kept
    /// 16 MB response cost 31 MB once its callback had read the body).
    @Test(arguments: ["none", "json", "marshal"])
    func aLargeBodysCopyForTheCallbackIsNotKeptInHistory(_ parse: String) throws {
        try withEngine(config) { engine, queue, _ in
            final class Parts: @unchecked Sendable {
                var sharesDetails: Bool?
                var formBody: [UInt8]?
                var body: [UInt8] = []
                var marshal: [UInt8]?
                var formMarshal: [UInt8]?
            }
            for (size, large) in [(200_000, true), (3_000, false)] {
                let parts = Parts()
                let request = json(#"{"url": "\#(server.url("/json?size=\(size)"))"}"#)
                let options = json(parse == "marshal" ? #"{"parse": "json", "marshal": true}"# : #"{"parse": "\#(parse)"}"#)
                _ = try withExtendedLifetime((request, options)) {
                    try engine.submitRequest(request.pointer, to: queue, options: options.pointer) { result in
                        parts.body = result.bodyBytes.map(Array.init) ?? []  // makes the copy of a large body
                        parts.sharesDetails = result.historyForm.map { $0.http?.details === result.http?.details }
                        parts.formBody = result.historyForm?.http?.body
                        parts.marshal = result.marshalBytes.map(Array.init)
                        parts.formMarshal = result.historyForm?.marshalBytes.map(Array.init)
                    }
                }
                #expect(engine.waitIdle(timeoutMs: 20_000) == .ok)
                #expect(parts.body.count >= size)
                if large {
                    #expect(parts.sharesDetails == false, "\(parse), \(size) bytes")
                } else {
                    // A small body is one copy, shared; without a value there is no form.
                    #expect(parts.sharesDetails == (parse == "none" ? nil : true), "\(parse), \(size) bytes")
                }
                #expect(parts.formBody == nil || parts.formBody! == parts.body)
                if parse == "marshal" {
                    // A dependent submitted later reads the same marshal data.
                    #expect(parts.marshal != nil && parts.formMarshal == parts.marshal, "\(size) bytes")
                }
            }
        }
    }
}
