import ArgumentParser
import FetchQ
import Glibc
import Synchronization

/// Submits one operation; throws the engine's FetchQError when it refuses it.
typealias Submit = (Engine, Queue) throws -> OpID

/// One CLI run: the engine, its queue, the console and progress, the Ctrl-C
/// watcher, and the tally that decides the exit status.
final class Session: Sendable {
    let engine: Engine
    let queue: Queue
    let console: Console
    let progress: Progress
    /// Per-operation options shared by every submit of this run.
    let operationOptions: JSONRef
    private let interrupted = Atomic<Bool>(false)
    private let failures = Atomic<Int>(0)
    private let cancellations = Atomic<Int>(0)

    /// Creates the engine (config: --per-host, plus `search` for searches).
    /// An option the engine rejects is a usage error: its message, exit 2.
    /// An engine that cannot start (the system refused it a thread) is
    /// not: its message, exit 1.
    init(_ common: CommonOptions, search: JSONRef? = nil, extraOptions: [(String, JSONRef)] = []) throws {
        console = Console()
        let config = JSONRef.object()
        if let n = common.perHost { config.set("max_per_host", .integer(Int64(n))) }
        if let search { config.set("search", search) }
        do {
            engine = try withExtendedLifetime(config) { () throws(FetchQError) in try Engine(json: config.pointer) }
            queue = try engine.makeQueue(name: "fetchq", maxConcurrent: common.concurrency)
        } catch {
            console.error(error.message)
            throw ExitCode(Self.exitStatus(refused: error))
        }
        console.onWriteError { [engine] in _ = engine.cancelAll() }
        engine.setLogCallback { [console] level, line in console.line("fetchq \(level): \(line)") }
        progress = Progress(console: console, visible: isatty(2) == 1 && !common.noProgress)
        let options = common.operationOptions(progress: progress.visible)
        for (key, value) in extraOptions { options.set(key, value) }
        operationOptions = options
        if progress.visible {
            engine.setEventHandler { [progress] event in
                switch event.kind {
                case .progress:
                    progress.received(event.id, event.received)
                case .child:
                    if let child = event.child {
                        progress.ended(child.id, bytes: Self.bytes(of: child), failed: child.outcome == .failed)
                    }
                case .update:
                    break  // a cached answer before the fresh one: the final one counts
                }
            }
        }
    }

    /// The exit status for an error of the engine before anything was sent:
    /// 2 (usage) when it rejected what it was given, 1 when it could not do
    /// it (no thread, memory or file for it).
    static func exitStatus(refused error: FetchQError) -> Int32 {
        error.status == .invalid || error.status == .notFound ? 2 : 1
    }

    /// Ctrl-C was pressed: what is still being written may stop.
    var isInterrupted: Bool { interrupted.load(ordering: .sequentiallyConsistent) }

    /// Said after "interrupted" (what an interrupted run did not print).
    nonisolated(unsafe) var interruptNote: String? = nil

    /// Submits every operation to the suspended queue (nothing starts until
    /// all of them were accepted), lets them run, waits for every one to end
    /// and returns by throwing the exit status: 0 all succeeded, 1 one
    /// failed, 2 the engine refused a submit, 130 interrupted by Ctrl-C.
    func run(_ submits: [Submit]) throws -> Never {
        Interrupt.install { [self] in
            interrupted.store(true, ordering: .sequentiallyConsistent)
            _ = engine.cancelAll()
        }
        queue.setSuspended(true)
        for submit in submits {
            do {
                _ = try submit(engine, queue)
            } catch {
                console.error((error as? FetchQError)?.message ?? "\(error)")
                _ = engine.cancelAll()
                _ = engine.waitIdle(timeoutMs: -1)
                _ = engine.shutdown()
                throw ExitCode((error as? FetchQError).map(Self.exitStatus(refused:)) ?? 2)
            }
        }
        if interrupted.load(ordering: .sequentiallyConsistent) { _ = engine.cancelAll() }
        queue.setSuspended(false)
        progress.start()
        _ = engine.waitIdle(timeoutMs: -1)
        progress.finish()
        _ = engine.shutdown()
        if interrupted.load(ordering: .sequentiallyConsistent) {
            console.error("interrupted" + (interruptNote.map { "; \($0)" } ?? ""))
            throw ExitCode(130)
        }
        let writeError = console.writeError
        if writeError != 0 {
            // What was left was cancelled: its results could not be written either.
            console.error("cannot write the results to standard output: \(String(cString: strerror(writeError)))")
            throw ExitCode(1)
        }
        if failures.load(ordering: .sequentiallyConsistent) > 0
            || cancellations.load(ordering: .sequentiallyConsistent) > 0 {
            throw ExitCode(1)
        }
        throw ExitCode.success
    }

    /// Reports a failure on stderr and counts it. `message` is the engine's;
    /// `label` ("GET URL", "search \"q\"") is put in front unless the message
    /// already begins with it.
    func failed(_ label: String, _ message: String?) {
        failures.add(1, ordering: .sequentiallyConsistent)
        let text = message ?? "failed"
        console.error(text.hasPrefix(label) ? text : "\(label): \(text)")
    }

    /// Books the end of an operation whose result is `result`; true when it
    /// succeeded (the caller then prints its value).
    func ended(_ result: OperationResult, label: String, countsInProgress: Bool = true) -> Bool {
        if countsInProgress {
            progress.ended(result.id, bytes: Self.bytes(of: result), failed: result.outcome == .failed)
        }
        switch result.outcome {
        case .succeeded:
            return true
        case .failed:
            failed(label, result.message)
        case .cancelled:
            cancellations.add(1, ordering: .sequentiallyConsistent)
        }
        return false
    }

    static func bytes(of result: OperationResult) -> UInt64? {
        guard let n = result.http?.metrics?["bytes"]?.integerValue, n >= 0 else { return nil }
        return UInt64(n)
    }
}
