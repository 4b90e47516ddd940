import CJansson
@testable import FetchQ
import Glibc

/// Collects completions of an engine's operations for tests: every callback
/// is counted (a second one for the same id is recorded as a violation).
final class Completions: @unchecked Sendable {  // all state guarded by `lock`
    private let lock = ConditionLock()
    private var results: [OpID: OperationResult] = [:]
    private var order: [OpID] = []
    private(set) var duplicates: [OpID] = []
    private var events: [OperationEvent] = []
    /// Every callback and event in delivery order: "done <id>" / "event <id>".
    private var log: [String] = []

    var callback: Completion {
        { [self] result in
            lock.withLock {
                if results[result.id] != nil { duplicates.append(result.id) }
                results[result.id] = result
                order.append(result.id)
                log.append("done \(result.id)")
            }
            lock.broadcast()
        }
    }

    var eventHandler: EventHandler {
        { [self] event in
            lock.withLock {
                events.append(event)
                log.append("event \(event.id)")
            }
        }
    }

    /// Waits (bounded) for the completion of `id`.
    func wait(_ id: OpID, timeoutMs: Int = 20_000) -> OperationResult? {
        let until = deadline(afterMs: timeoutMs)
        return lock.withLock {
            while results[id] == nil {
                if !lock.wait(until: until) && results[id] == nil { return nil }
            }
            return results[id]
        }
    }

    func waitAll(_ ids: [OpID], timeoutMs: Int = 30_000) -> [OperationResult]? {
        var out: [OperationResult] = []
        for id in ids {
            guard let r = wait(id, timeoutMs: timeoutMs) else { return nil }
            out.append(r)
        }
        return out
    }

    var completionOrder: [OpID] { lock.withLock { order } }
    var deliveryLog: [String] { lock.withLock { log } }
    var allEvents: [OperationEvent] { lock.withLock { events } }
    var count: Int { lock.withLock { results.count } }
}

/// Builds a jansson object from JSON text (test input).
func json(_ text: String) -> JSONRef {
    var error = json_error_t()
    guard let value = json_loads(text, 0, &error) else {
        let message = withUnsafeBytes(of: error.text) { String(decoding: $0.prefix(while: { $0 != 0 }), as: UTF8.self) }
        fatalError("bad test JSON: \(text): \(message)")
    }
    return JSONRef(owned: value)!
}

extension JSONRef {
    /// The value at a JSON Pointer, or nil.
    func at(_ pointer: String) -> JSONRef? {
        (try? JSONPointer(pointer))?.resolve(in: self)
    }

    var text: String { dumps(compact: true, sorted: true) }
}

/// Runs `body` with an engine and a queue, shutting the engine down after.
@discardableResult
func withEngine<T>(_ config: String = "{}", queue maxConcurrent: Int = 4,
                   _ body: (Engine, Queue, Completions) throws -> T) throws -> T {
    let configJSON = json(config)
    let engine = try withExtendedLifetime(configJSON) { try Engine(json: configJSON.pointer) }
    defer { _ = engine.shutdown() }
    let queue = try engine.makeQueue(name: "test", maxConcurrent: maxConcurrent)
    let completions = Completions()
    engine.setEventHandler(completions.eventHandler)
    return try body(engine, queue, completions)
}

extension Engine {
    func request(_ request: String, options: String? = nil, on queue: Queue, _ c: Completions) throws -> OpID {
        let r = json(request)
        let o = options.map { json($0) }
        return try withExtendedLifetime((r, o)) {
            try submitRequest(r.pointer, to: queue, options: o?.pointer, completion: c.callback)
        }
    }

    func search(_ query: String, options: String? = nil, on queue: Queue, _ c: Completions) throws -> OpID {
        let o = options.map { json($0) }
        return try withExtendedLifetime(o) {
            try submitSearch(query, to: queue, options: o?.pointer, completion: c.callback)
        }
    }
}

extension TestServer {
    /// An engine config whose search endpoint is this server's /search
    /// (results at /results, ids at /id, newest first), 8 per host.
    var searchConfig: String {
        """
        {"search": {"url": "\(url("/search?q={query}&rpp=500"))", "results": "/results",
                    "id": "/id", "sort": "/created_at", "order": "desc"}, "max_per_host": 8}
        """
    }
}
