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
 (let ((?x11 (to_real N)))
 (<= 1.0 ?x11)))
(assert
 (< 0.0 psi))
(assert
 (let ((?x11 (to_real N)))
 (and (distinct ?x11 0.0) true)))
(assert
 (let ((?x11 (to_real N)))
 (and (distinct ?x11 0.0) true)))
(assert
 (let ((?x19 (* 4.0 psi)))
(let ((?x20 (+ ?x19 (* (* K psi) (/ 1.0 (to_real N))))))
(not (= ?x20 ?x20)))))
(check-sat)
(exit)
