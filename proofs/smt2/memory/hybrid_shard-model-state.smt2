; placement-logic proof obligation: memory/hybrid_shard-model-state
; theorem: Memory derivation
; FSDP HYBRID_SHARD model state = (4 + K)Ψ/N_shard
;   ∀ Ψ > 0, K > 0, N, R ∈ ℤ, N, R ≥ 1: model_state(HYBRID_SHARD over (R, N)) = (2 + 2 + K)Ψ/N
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun R () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
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
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x2 (+ (* (* 4.0 psi) (/ 1.0 (to_real N))) (* (* K psi) (/ 1.0 (to_real N))))))
(not (= ?x2 (* (* psi (/ 1.0 (to_real N))) (+ 4.0 K))))))
(check-sat)
(exit)
