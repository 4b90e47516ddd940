@testable import FetchQ

/// Runs `body(0..<count)` on `count` threads (the engine's own thread
/// helper) and joins them all.
func runThreads(_ count: Int, _ body: @escaping @Sendable (Int) -> Void) {
    let threads = (0..<count).map { index in try! startThread(name: "test-\(index)") { body(index) } }
    for thread in threads { joinThread(thread) }
}
