; placement-logic proof obligation: memory/fsdp_shard_grad_op-peak
; theorem: Memory derivation
; FSDP SHARD_GRAD_OP peak = (4 + K)Ψ/N + 2Ψ (params kept gathered)
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1: memory(FSDP SHARD_GRAD_OP) = (2 + 2 + K)Ψ/N + 2Ψ
; the assertions are the NEGATION of the statement:
;   expected unsat (statement proved)
(set-logic ALL)
(set-info :status unsat)
(declare-fun K () Real)
(declare-fun N () Int)
(declare-fun psi () Real)
(assert
 (< 0.0 K))
(assert
 (let ((?x0 (to_real N)))
 (<= 1.0 ?x0)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x0 (to_real N)))
 (and (distinct ?x0 0.0) true)))
(assert
 (let ((?x1 (* 2.0 psi)))
(let ((?x2 (+ (+ ?x1 (* (* 4.0 psi) (/ 1.0 (to_real N)))) (* (* K psi) (/ 1.0 (to_real N))))))
(let (($x0 (= ?x2 (+ ?x1 (* (* psi (/ 1.0 (to_real N))) (+ 4.0 K))))))
(not $x0)))))
(check-sat)
(exit)
