// anchors — Foundation baselines for the fetchq benchmarks.
//
//   anchors p1 plain|prio|chain N     N no-op BlockOperations, maxConcurrentOperationCount 2
//   anchors p7 TEMPLATE N C           N searches: an asynchronous Operation per search on an
//                                     OperationQueue (max C) running a URLSession data task
//                                     (httpMaximumConnectionsPerHost C), the body parsed with
//                                     JSONSerialization, results extracted and sorted by score
//
// Prints one JSON object on stdout, like bench/fq_bench.
import Dispatch
import Foundation
import Synchronization
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif

func now() -> Double {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Double(ts.tv_sec) + Double(ts.tv_nsec) / 1e9
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write("anchors: \(message)\n".data(using: .utf8)!)
    exit(1)
}

// MARK: - P1

func p1(_ variant: String, _ n: Int) {
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = 2
    let levels: [Operation.QueuePriority] = [.veryLow, .low, .normal, .high, .veryHigh]
    let done = ManagedAtomicCounter()
    let t0 = now()
    var previous: Operation? = nil
    for i in 0..<n {
        let op = BlockOperation { done.increment() }
        switch variant {
        case "plain": break
        case "prio": op.queuePriority = levels[i % 5]
        case "chain": if let previous { op.addDependency(previous) }
        default: fail("p1 variant plain|prio|chain")
        }
        queue.addOperation(op)
        if variant == "chain" { previous = op }
    }
    let tSubmit = now() - t0
    queue.waitUntilAllOperationsAreFinished()
    let t = now() - t0
    guard done.value == n else { fail("p1: \(done.value) of \(n) ran") }
    print(#"{"bench":"p1-anchor","variant":"\#(variant)","n":\#(n),"seconds":\#(t),"submit_seconds":\#(tSubmit),"rate":\#(Double(n) / t)}"#)
    // Leave without releasing the operations: a finished chain is released
    // recursively (each operation holds its dependencies) and 1M levels
    // overflow the stack in Operation.deinit.
    fflush(stdout)
    withExtendedLifetime(previous) { exit(0) }
}

/// A counter for the block bodies (they run on the queue's threads): an
/// atomic, as fetchq's callbacks and the bare queue's tasks count (it was a
/// lock, a small handicap for the anchor: the eleventh review).
final class ManagedAtomicCounter: Sendable {
    private let count = Atomic<Int>(0)
    func increment() { count.wrappingAdd(1, ordering: .relaxed) }
    var value: Int { count.load(ordering: .acquiring) }
}

// MARK: - P7

/// The seeds' search operation: asynchronous, finished from the data task's
/// completion handler after parsing (isExecuting/isFinished by KVO).
final class SearchOperation: Operation, @unchecked Sendable {  // state guarded by lock
    let url: URL
    let session: URLSession
    let report: (Result<[[String: Any]], Error>) -> Void
    private let lock = NSLock()
    private var executing = false
    private var finished = false

    init(url: URL, session: URLSession, report: @escaping (Result<[[String: Any]], Error>) -> Void) {
        self.url = url
        self.session = session
        self.report = report
    }

    override var isAsynchronous: Bool { true }
    override var isExecuting: Bool { lock.lock(); defer { lock.unlock() }; return executing }
    override var isFinished: Bool { lock.lock(); defer { lock.unlock() }; return finished }

    override func start() {
        if isCancelled { return finish() }
        willChangeValue(forKey: "isExecuting")
        lock.lock(); executing = true; lock.unlock()
        didChangeValue(forKey: "isExecuting")
        session.dataTask(with: url) { [self] data, response, error in
            if let error { report(.failure(error)) } else {
                do {
                    guard (response as? HTTPURLResponse)?.statusCode == 200, let data,
                          let root = try JSONSerialization.jsonObject(with: data) as? [String: Any],
                          let results = root["results"] as? [[String: Any]]
                    else { throw URLError(.cannotParseResponse) }
                    let sorted = results.sorted {
                        (($0["score"] as? NSNumber)?.doubleValue ?? -.infinity) > (($1["score"] as? NSNumber)?.doubleValue ?? -.infinity)
                    }
                    report(.success(sorted))
                } catch { report(.failure(error)) }
            }
            finish()
        }.resume()
    }

    private func finish() {
        willChangeValue(forKey: "isExecuting")
        willChangeValue(forKey: "isFinished")
        lock.lock(); executing = false; finished = true; lock.unlock()
        didChangeValue(forKey: "isExecuting")
        didChangeValue(forKey: "isFinished")
    }
}

func p7(_ template: String, _ n: Int, _ c: Int) {
    let config = URLSessionConfiguration.default
    config.httpMaximumConnectionsPerHost = c
    config.requestCachePolicy = .reloadIgnoringLocalCacheData
    config.urlCache = nil
    let session = URLSession(configuration: config)
    let queue = OperationQueue()
    queue.maxConcurrentOperationCount = c
    let lock = NSLock()
    var ok = 0, bad = 0
    let t0 = now()
    for i in 0..<n {
        // "qN ü", as bench/gen_data.py names them: a space and a non-ASCII
        // letter to encode. .urlPathAllowed: {query} is in the URL's path.
        let q = "q\(i) ü".addingPercentEncoding(withAllowedCharacters: .urlPathAllowed)!
        guard let url = URL(string: template.replacingOccurrences(of: "{query}", with: q)) else { fail("bad URL") }
        queue.addOperation(SearchOperation(url: url, session: session) { result in
            lock.lock()
            defer { lock.unlock() }
            switch result {
            case .success(let items): if items.isEmpty { bad += 1 } else { ok += 1 }
            case .failure(let error):
                if bad < 3 { FileHandle.standardError.write("anchors: \(error)\n".data(using: .utf8)!) }
                bad += 1
            }
        })
    }
    queue.waitUntilAllOperationsAreFinished()
    let t = now() - t0
    guard ok == n else { fail("p7: \(ok) of \(n) succeeded, \(bad) failed") }
    print(#"{"bench":"p7-anchor","n":\#(n),"concurrency":\#(c),"seconds":\#(t),"rate":\#(Double(n) / t)}"#)
}

let args = CommandLine.arguments
switch (args.count > 1 ? args[1] : "", args.count) {
case ("p1", 4): p1(args[2], Int(args[3])!)
case ("p7", 5): p7(args[2], Int(args[3])!, Int(args[4])!)
default:
    fail("usage: anchors p1 plain|prio|chain N | p7 TEMPLATE N C")
}
