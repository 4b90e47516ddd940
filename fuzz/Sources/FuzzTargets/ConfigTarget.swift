import CJansson
import FetchQ
import Glibc
import Synchronization

/// Target (a): strict option parsing. The input, parsed as JSON, is used as
///
/// - an engine configuration (`EngineConfig(json:)`, as fq_engine_new reads it); a
///   configuration that parses starts an engine (with one worker), which runs a search
///   on a suspended queue (cancelled) and is shut down;
/// - the options of every submit (block, request, search, search-all) and the request
///   object of `submitRequest`, on two long-lived engines (thread and poll delivery)
///   whose queue is suspended, so nothing reaches the network: every accepted
///   operation is cancelled at once.
///
/// Oracles: a configuration error is FQ_ERR_INVALID with a message; a submit that throws
/// never calls its completion; one that returns an id calls it exactly once, CANCELLED
/// when the cancel returned OK; the queues drain; every 256 inputs nothing is left
/// queued or running.
///
/// To keep runs reproducible, ids in "depends_on" name per-input fixtures (see
/// `Fixtures`); option "store" and config "cache" get a private temporary "path" so
/// that the fuzzer cannot write SQLite files elsewhere.
public enum ConfigTarget {
    /// The query submitted; characters that the URL template must percent-encode.
    static let query = "fuzz q&r=1/é#?%"

    static let storePath: String = {
        let path = "/tmp/fetchq-fuzz-\(getpid()).sqlite"
        atexit {
            let base = "/tmp/fetchq-fuzz-\(getpid()).sqlite"
            for file in [base, base + "-cache"] {
                for suffix in ["", "-wal", "-shm", "-journal"] { unlink(file + suffix) }
            }
        }
        return path
    }()

    /// A long-lived engine: a suspended queue for the operations under test and a
    /// running one for the dependency fixtures.
    struct Bench {
        let engine: Engine
        let held: Queue
        let running: Queue
    }

    /// An engine with a configured search endpoint (thread delivery), and one without
    /// (poll delivery: `Queue.wait` dispatches).
    static let benches: [Bench] = [
        #"{"workers": 1, "search": {"url": "http://127.0.0.1:9/search?q={query}", "results": "/results", "sort": "/created_at"}}"#,
        #"{"workers": 1, "delivery": "poll"}"#,
    ].map { text in
        let config = try! JSONParser.parse(text, maxDepth: 8)
        let engine = try! Engine(json: config.pointer)
        let held = try! engine.makeQueue(name: "held", maxConcurrent: 4)
        held.setSuspended(true)
        return Bench(engine: engine, held: held, running: try! engine.makeQueue(name: "running", maxConcurrent: 4))
    }

    static let fixedRequest = try! JSONParser.parse(#"{"url": "http://127.0.0.1:9/x"}"#, maxDepth: 4)

    public static func run(_ data: UnsafeRawBufferPointer) {
        guard let doc = try? JSONParser.parse(data, maxDepth: 64) else { return }
        confineFiles(doc.pointer)
        checkConfig(doc)
        var pending: [Call] = []
        for bench in benches {
            let (engine, queue) = (bench.engine, bench.held)
            let fixtures = Fixtures(bench, for: doc)
            let options = fixtures.options.pointer
            pending.append(submit(engine) { try engine.submit(.block { _ in nil }, to: queue, options: options, completion: $0) })
            pending.append(submit(engine) { try engine.submitRequest(options, to: queue, options: nil, completion: $0) })
            pending.append(submit(engine) {
                try engine.submitRequest(fixedRequest.pointer, to: queue, options: options, completion: $0)
            })
            pending.append(submit(engine) { try engine.submitSearch(query, to: queue, options: options, completion: $0) })
            pending.append(submit(engine) {
                try engine.submitSearchAll([query, "b", query], to: queue, options: options, completion: $0)
            })
            fixtures.release()
        }
        for bench in benches {
            for queue in [bench.held, bench.running] {
                let status = queue.wait(timeoutMs: 20_000)
                require(status == .ok, "queue \(queue.name) did not drain after cancelling: \(status)")
            }
        }
        for call in pending { call.check() }
        iterations += 1
        if iterations % 256 == 0 { checkIdle() }
    }

    nonisolated(unsafe) static var iterations = 0

    /// Operations in each state a dependency can be in, so that "depends_on" means the
    /// same in every run whatever ran before: in the options each id n > 0 below
    /// 1,000,000 is replaced by fixture n % 4 (0 succeeded, 1 failed, 2 cancelled,
    /// 3 still queued, cancelled once the input's submits are done); other values stay
    /// (unknown ids, invalid ids).
    struct Fixtures {
        let options: JSONRef
        private let bench: Bench
        private var queued: OpID = 0

        init(_ bench: Bench, for doc: JSONRef) {
            self.bench = bench
            guard doc.isObject, let deps = json_object_get(doc.pointer, "depends_on"),
                  deps.pointee.type == JSON_ARRAY, json_array_size(deps) > 0 else {
                options = doc
                return
            }
            let engine = bench.engine
            let ok = try! engine.submit(.block { _ in JSONRef.integer(1) }, to: bench.running, options: nil, completion: nil)
            let failed = try! engine.submit(.block { op in try? op.setError("fixture"); return nil },
                                           to: bench.running, options: nil, completion: nil)
            let cancelled = try! engine.submit(.block { _ in nil }, to: bench.held, options: nil, completion: nil)
            try! engine.cancel(cancelled)
            queued = try! engine.submit(.block { _ in nil }, to: bench.held, options: nil, completion: nil)
            require(bench.running.wait(timeoutMs: 20_000) == .ok, "fixtures did not run")
            let ids = [ok, failed, cancelled, queued]
            options = JSONRef(owned: json_deep_copy(doc.pointer))!
            let copy = json_object_get(options.pointer, "depends_on")!
            for i in 0..<json_array_size(copy) {
                let item = json_array_get(copy, i)!
                guard item.pointee.type == JSON_INTEGER else { continue }
                let n = json_integer_value(item)
                guard n > 0 && n < 1_000_000 else { continue }
                json_array_set_new(copy, i, json_integer(json_int_t(ids[Int(n % 4)])))
            }
        }

        func release() {
            if queued != 0 { try! bench.engine.cancel(queued) }
        }
    }

    // MARK: - Configuration

    static func checkConfig(_ doc: JSONRef) {
        let config: EngineConfig
        do {
            config = try EngineConfig(json: doc.pointer)
        } catch {
            require(error.status == .invalid && !error.message.isEmpty, "config error \(error.status): \(error.message)")
            return
        }
        var small = config
        small.workers = 1
        small.log = "off"  // a fuzzed "debug" would write every operation to stderr
        let engine: Engine
        do {
            engine = try Engine(config: small)
        } catch {
            require(false, "a valid configuration was refused: \(error.message)")
            return
        }
        if config.search != nil, let queue = try? engine.makeQueue(name: "q", maxConcurrent: 1) {
            queue.setSuspended(true)
            let call = submit(engine) { try engine.submitSearch(query, to: queue, options: nil, completion: $0) }
            require(queue.wait(timeoutMs: 20_000) == .ok, "queue did not drain")
            call.check()
        }
        require(engine.shutdown() == .ok, "shutdown failed")
    }

    // MARK: - Submitting

    /// One submit and what its completion did.
    final class Call: @unchecked Sendable {  // `calls`/`outcome` are guarded by `lock`
        let lock = Mutex<(calls: Int, outcome: Outcome?)>((0, nil))
        var id: OpID = 0
        var error: FetchQError?
        var cancelAccepted = false

        func record(_ result: OperationResult) {
            lock.withLock { state in
                state.calls += 1
                state.outcome = result.outcome
            }
        }

        func check() {
            let (calls, outcome) = lock.withLock { ($0.calls, $0.outcome) }
            if let error {
                require(calls == 0, "completion called \(calls)x after the submit failed (\(error.message))")
                return
            }
            require(calls == 1, "completion of operation \(id) called \(calls) times")
            if cancelAccepted {
                require(outcome == .cancelled, "operation \(id): cancel returned OK, outcome \(String(describing: outcome))")
            }
        }
    }

    static func submit(_ engine: Engine, _ body: (@escaping Completion) throws -> OpID) -> Call {
        let call = Call()
        do {
            call.id = try body { [call] in call.record($0) }
        } catch {
            guard let error = error as? FetchQError else {
                require(false, "submit threw \(error)")
                return call
            }
            require([.invalid, .notFound, .store, .cycle].contains(error.status) && !error.message.isEmpty,
                    "submit error \(error.status): \(error.message)")
            call.error = error
            return call
        }
        require(call.id > 0, "submit returned id \(call.id)")
        do {
            try engine.cancel(call.id)
            call.cancelAccepted = true
        } catch {
            // Already ended (e.g. a failed dependency): its completion is still due once.
        }
        return call
    }

    /// Nothing queued or running on the long-lived engines (cancelled work is gone,
    /// including coalesced transfers' internal carriers).
    static func checkIdle() {
        for bench in benches {
            let stats = bench.engine.stats()
            let queued = stats["queued"]?.integerValue ?? -1
            let running = stats["running"]?.integerValue ?? -1
            require(queued == 0 && running == 0, "engine not idle after cancelling everything: \(stats)")
        }
    }

    // MARK: - File confinement

    /// Rewrites "store": {"path"} (search options) and "cache": {"path"} (engine
    /// configuration) at the top level, where they are read, to private temporary
    /// files.
    static func confineFiles(_ doc: UnsafeMutablePointer<json_t>) {
        guard doc.pointee.type == JSON_OBJECT else { return }
        for (key, path) in [("store", storePath), ("cache", storePath + "-cache")] {
            guard let object = json_object_get(doc, key), object.pointee.type == JSON_OBJECT,
                  let old = json_object_get(object, "path"), old.pointee.type == JSON_STRING else { continue }
            json_object_set_new(object, "path", json_string(path))
        }
    }
}
