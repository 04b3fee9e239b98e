; placement-logic proof obligation: comm/hybrid_shard-ring
; theorem: Communication derivation
; HYBRID_SHARD ring = 3(N−1)/N·2Ψ + 2(R−1)/R·2Ψ/N
;   ∀ Ψ > 0, N, R ∈ ℤ, N, R ≥ 1: comm(HYBRID_SHARD) = 3(N − 1)/N · 2Ψ + 2(R − 1)/R · 2Ψ/N (gather in forward and backward and reduce-scatter in the shard group, all-reduce of the shard across replicas)
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun N () Int)
(declare-fun R () Int)
(declare-fun psi () Real)
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (let ((?x1 (to_real R)))
 (<= 1.0 ?x1)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (to_real R)))
 (and (distinct ?x1 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (to_real R)))
 (and (distinct ?x1 0.0) true)))
(assert
 (let ((?x1 (to_real R)))
(let ((?x2 (/ 1.0 ?x1)))
(let ((?x0 (to_real N)))
(let ((?x3 (/ 1.0 ?x0)))
(let ((?x4 (* (* 2.0 psi) ?x3)))
(let ((?x5 (* (* ?x4 ?x2) (+ (- 2.0) (* 2.0 ?x1)))))
(let (($x0 (= (+ (* (* (* 6.0 psi) ?x3) (+ (- 1.0) ?x0)) ?x5) (+ (* ?x4 (+ (- 3.0) (* 3.0 ?x0))) ?x5))))
(not $x0)))))))))
(check-sat)
(exit)
