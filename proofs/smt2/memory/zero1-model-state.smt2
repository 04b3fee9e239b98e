; placement-logic proof obligation: memory/zero1-model-state
; theorem: Memory derivation
; ZeRO-1 model state = 4Ψ + KΨ/N
;   ∀ Ψ > 0, K > 0, N ∈ ℤ, N ≥ 1: model_state(ZeRO-1) = 4Ψ + KΨ/N
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
 (let ((?x1 (* 4.0 psi)))
(let ((?x2 (+ ?x1 (* (* K psi) (/ 1.0 (to_real N))))))
(not (= ?x2 ?x2)))))
(check-sat)
(exit)
